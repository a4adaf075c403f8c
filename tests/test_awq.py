"""AWQ's scale search (labsupport.lab.quantization_awq, notebook 04's exercise 3) on the embedded model's own
activations: the numbers the exercise rests on, its checker on the notebook's layer, and the
scales folded into the model (its checker's made-up layers: tests/test_checkers.py)."""

import math

import pytest
import torch

from labsupport.checks import CheckFailed
from labsupport.checks.quantization_awq import check_awq_search
from labsupport.lab import quantization_awq, quality

from checker_cases.nb04_quantization import reference_search, search_with

CALIBRATION, HELD_OUT = 256, 128                       # the notebook's split: perplexity's tokens held out


@pytest.fixture(scope="module")
def last_down(smollm):
    """The notebook's layer (the last block's MLP down projection), its weight and its inputs."""
    model, tokenizer = smollm
    name = f"blocks.{model.config.num_layers - 1}.mlp.down"
    x = quantization_awq.layer_inputs(model, name, quality.eval_tokens(tokenizer, max_tokens=HELD_OUT + CALIBRATION))
    weight = model.get_submodule(name).weight.detach().float().cpu()
    return name, weight, x[HELD_OUT:], x[:HELD_OUT]


def test_the_search_removes_a_clear_share_of_int4s_output_error_on_real_activations(last_down):
    name, weight, calibration, held_out = last_down
    assert calibration.shape == (CALIBRATION, weight.shape[1])
    scales, errors = quantization_awq.awq_search(weight, calibration, 128)
    best = quantization_awq.AWQ_GRID[errors.index(min(errors))]
    assert 0 < best < 1                                 # an inner alpha: neither plain int4 nor the grid's end
    assert 1 - min(errors) / errors[0] > 0.3            # on the calibration tokens (49% when written)
    held = quantization_awq.error_removed(weight, held_out, 128, scales)
    assert held["removed"] > 0.2                        # on the held-out tokens (35% when written)
    # groups of 32 reproduce this model's Q4_1 weights exactly: no error for AWQ to remove there
    _, plain32 = quantization_awq.awq_search(weight, calibration, 32, [0.0])
    assert plain32[0] < 1e-3 * errors[0]


def test_the_checker_takes_the_notebooks_layer(last_down, capsys):
    name, weight, calibration, held_out = last_down
    check_awq_search(reference_search, weight, calibration, held_out, group_size=128, layer=name)
    out = capsys.readouterr().out
    assert "Correct" in out and name in out and "removes" in out
    with pytest.raises(CheckFailed, match="search the grid"):
        check_awq_search(lambda *a: search_with(*a, fixed=0.5), weight, calibration, held_out, layer=name)
    with pytest.raises(CheckFailed, match="held-out activations"):
        check_awq_search(reference_search, weight, calibration)


def test_the_folded_scales_lower_the_perplexity_and_the_model_comes_back_as_it_was(smollm, last_down):
    model, tokenizer = smollm
    name, weight, calibration, _ = last_down
    gate_up = model.get_submodule(name.rsplit(".", 1)[0]).gate_up.weight.detach().clone()
    before = quality.perplexity(model, tokenizer, max_tokens=HELD_OUT)
    scales, _ = quantization_awq.awq_search(weight, calibration, 128)
    with quantization_awq.awq_int4_down(model, name, 128):
        plain = quality.perplexity(model, tokenizer, max_tokens=HELD_OUT)
    with quantization_awq.awq_int4_down(model, name, 128, scales) as layer:
        assert layer is model.get_submodule(name)
        scaled = quality.perplexity(model, tokenizer, max_tokens=HELD_OUT)
    assert before < scaled < plain                      # 36.65 < 36.72 < 37.61 when written
    assert model.get_submodule(name).weight.detach().float().cpu().equal(weight)
    assert model.get_submodule(name.rsplit(".", 1)[0]).gate_up.weight.equal(gate_up)
    assert quality.perplexity(model, tokenizer, max_tokens=HELD_OUT) == before


def test_only_a_down_projection_takes_the_fold(smollm):
    from labsupport.errors import LabError
    model, _ = smollm
    with pytest.raises(LabError, match="not an MLP down projection"):
        with quantization_awq.awq_int4_down(model, "blocks.0.attn.qkv", 64):
            pass
    assert isinstance(model.get_submodule("blocks.0.mlp.down"), torch.nn.Linear)


def test_bad_names_shapes_and_reuse_of_the_fold(smollm, last_down):
    from labsupport.errors import LabError
    model, tokenizer = smollm
    name, weight, calibration, _ = last_down
    with pytest.raises(LabError, match="no submodule 'blocks.99.mlp.down'"):
        quantization_awq.layer_inputs(model, "blocks.99.mlp.down", [1, 2, 3])
    with pytest.raises(LabError, match="no submodule"):
        with quantization_awq.awq_int4_down(model, "blocks.99.mlp.down", 64):
            pass
    with pytest.raises(LabError, match="activations must be"):
        quantization_awq.awq_search(weight, calibration[:, :10], 128)
    with pytest.raises(LabError, match="one value per input channel"):
        with quantization_awq.awq_int4_down(model, name, 128, torch.ones(7)):
            pass
    before = quality.perplexity(model, tokenizer, max_tokens=32)
    scales, _ = quantization_awq.awq_search(weight, calibration, 128)
    for _ in range(2):                                   # the fold applied twice, each time put back
        with quantization_awq.awq_int4_down(model, name, 128, scales):
            pass
        assert quality.perplexity(model, tokenizer, max_tokens=32) == before


# --- issue 50: silently wrong and loud-but-bad inputs, each one sentence (tiny made-up layers, no model) ---

def _tiny_layer(seed=0, out_features=4, in_features=8, tokens=6):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(out_features, in_features, generator=generator),
            torch.randn(tokens, in_features, generator=generator) * torch.linspace(0.1, 3.0, in_features))


def test_error_removed_takes_an_nn_linear_weight_and_activations_caught_in_inference_mode():
    """The natural call (a layer's weight, which requires grad; activations from layer_inputs, made under
    inference mode) raised torch's 'Inference tensors cannot be saved for backward'."""
    layer = torch.nn.Linear(8, 4)
    with torch.inference_mode():
        x = torch.randn(6, 8) * torch.linspace(0.1, 3.0, 8)
    scales, errors = quantization_awq.awq_search(layer.weight, x, 4)
    held = quantization_awq.error_removed(layer.weight, x, 4, scales)
    assert held["awq"] == pytest.approx(min(errors)) and 0 <= held["removed"] < 1
    assert not quantization_awq.awq_weight(layer.weight, scales, 4).requires_grad
    assert quantization_awq.output_error(layer.weight, layer.weight, x) == 0.0


def test_a_scale_of_zero_is_refused_not_folded_into_nan_logits():
    """A zero scale divided the up projection by 0: the model's logits became nan."""
    from labsupport.errors import LabError
    from labsupport.lab.quality import logits_of
    from labsupport.weights.fixtures import random_model
    model = random_model("tiny-llama")
    name = "blocks.0.mlp.down"
    zero_one = torch.ones(model.get_submodule(name).in_features)
    zero_one[3] = 0.0
    before = logits_of(model, [1, 2, 3])
    for bad in (zero_one, -zero_one.abs() - 1, torch.full_like(zero_one, math.nan)):
        with pytest.raises(LabError, match="finite and > 0"):
            with quantization_awq.awq_int4_down(model, name, 32, bad):
                pass
        assert torch.equal(logits_of(model, [1, 2, 3]), before)          # nothing was changed
    weight, x = _tiny_layer()
    with pytest.raises(LabError, match="finite and > 0"):
        quantization_awq.error_removed(weight, x, 4, zero_one[:8])
    with pytest.raises(LabError, match="finite and > 0"):
        quantization_awq.awq_weight(weight, zero_one[:8], 4)


def test_layer_inputs_takes_only_a_linear_layer_the_model_runs():
    from labsupport.errors import LabError
    from labsupport.weights.fixtures import random_model
    model = random_model("tiny-llama")
    x = quantization_awq.layer_inputs(model, "blocks.0.mlp.down", [1, 2, 3])
    assert x.shape == (3, model.get_submodule("blocks.0.mlp.down").in_features) and not x.is_inference()
    for name in ("blocks.0", "blocks.0.mlp", "blocks.0.mlp_norm", "embed"):
        with pytest.raises(LabError, match="not a linear layer"):
            quantization_awq.layer_inputs(model, name, [1, 2, 3])
    with pytest.raises(LabError, match="text"):
        quantization_awq.layer_inputs(model, "blocks.0.mlp.down", "hello")
    with pytest.raises(LabError, match="outside the model's vocabulary"):
        quantization_awq.layer_inputs(model, "blocks.0.mlp.down", [10 ** 6])


@pytest.mark.parametrize("call, message", [
    (lambda w, x: quantization_awq.awq_search(w, x, 4, []), "grid is empty"),
    (lambda w, x: quantization_awq.awq_search(w, x, 4, [0.5, math.nan]), "from 0 to 1"),
    (lambda w, x: quantization_awq.awq_search(w, x, 4, [True]), "from 0 to 1"),
    (lambda w, x: quantization_awq.awq_search(w, x, 4, 0.5), "list of alphas"),
    (lambda w, x: quantization_awq.awq_search(w, x * math.nan, 4), "nan or inf"),
    (lambda w, x: quantization_awq.awq_search(w, x[:0], 4), "at least one token"),
    (lambda w, x: quantization_awq.awq_search(w.T, x, 4), "activations must be"),
    (lambda w, x: quantization_awq.awq_search(w[:0], x, 4), "non-empty"),
    (lambda w, x: quantization_awq.awq_search(w.tolist(), x, 4), "2-D torch tensor"),
    (lambda w, x: quantization_awq.awq_search(w, x, 3), "group_size"),
    (lambda w, x: quantization_awq.awq_search(w, x * 1e30, 4), "too large"),
    (lambda w, x: quantization_awq.error_removed(w, x, 4, torch.ones(7)), "one value per input channel"),
    (lambda w, x: quantization_awq.error_removed(w, x, 4, [1.0] * 8), "one value per input channel"),
    (lambda w, x: quantization_awq.scales_for(x.mean(dim=0), 0.5), ">= 0"),
    (lambda w, x: quantization_awq.scales_for(x.abs().mean(dim=0), 2.0), "from 0 to 1"),
    (lambda w, x: quantization_awq.output_error(w, w[:2], x), "weight's shape"),
])
def test_bad_arguments_of_the_search_and_its_steps_are_one_sentence(call, message):
    """Before: NaN errors returned (nan or empty activations), a TypeError (an empty grid), torch's
    errors (wrong-length scales, shapes)."""
    from labsupport.errors import LabError
    weight, x = _tiny_layer()
    with pytest.raises(LabError, match=message) as error:
        call(weight, x)
    assert "\n" not in str(error.value)
