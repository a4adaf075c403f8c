"""Weight-only quantization (notebook 04): arithmetic, kernels, the linear swap, model swaps, quality."""

import math
import warnings

import pytest
import torch
import torch.nn as nn

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.serve.text import generate_text
from labsupport.weights.fixtures import ByteTokenizer, random_model
from labsupport.engine.linear_swap import SwapHandle, swap_linears
from labsupport.engine.models.layout import apply_layout, relayout
from labsupport.engine.quant import (Int4Linear, Int8Linear, dequantize_int4, dequantize_int8, pack_int4,
                                     quantize_int4_groupwise, quantize_int8_absmax, quantize_model,
                                     quantized_replacement, unpack_int4, kernel_description)
from labsupport.lab.quantization_error import weight_error_stats
from labsupport.lab.quality import perplexity, quantized_bytes, top1_agreement

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def _weight(out_features=96, in_features=128, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.05


def _one_sentence(error: Exception) -> bool:
    text = str(error)
    return "\n" not in text and text.endswith(".") and text.count(". ") == 0


# --- arithmetic -----------------------------------------------------------------------------

def test_int8_round_trip_is_within_half_a_step():
    w = _weight()
    q, scale = quantize_int8_absmax(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (w.shape[0],)
    assert q.abs().max() <= 127
    error = (dequantize_int8(q, scale) - w).abs()
    assert (error <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_int4_round_trip_is_within_half_a_step_per_group(group_size):
    w = _weight()
    q, scales, zeros = quantize_int4_groupwise(w, group_size)
    groups = w.shape[1] // group_size
    assert q.dtype == torch.uint8 and q.shape == w.shape and int(q.max()) <= 15
    assert scales.shape == zeros.shape == (w.shape[0], groups)
    error = (dequantize_int4(q, scales, zeros) - w).abs()
    step = scales.repeat_interleave(group_size, dim=1)
    assert (error <= step / 2 + 1e-6).all()


def test_pack_unpack_round_trip():
    q = torch.randint(0, 16, (10, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    packed = pack_int4(q)
    assert packed.shape == (10, 16) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    assert int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)


def test_weight_error_stats():
    w = _weight()
    int8, int4 = weight_error_stats(w, "int8"), weight_error_stats(w, "int4", group_size=32)
    assert int8["error"].shape == w.shape
    assert 0 < int8["relative_frobenius"] < int4["relative_frobenius"] < 0.2
    assert int8["max_abs"] >= int8["mean_abs"] > 0


def test_bad_arguments_are_one_sentence():
    w = _weight(in_features=96)
    cases = [lambda: quantize_int4_groupwise(w, 64), lambda: quantize_int4_groupwise(w, 1),
             lambda: quantize_int8_absmax(torch.ones(3)), lambda: weight_error_stats(w, "int3"),
             lambda: quantize_model(random_model("tiny-llama"), "int3"),
             lambda: quantize_model(random_model("tiny-llama"), "int4", group_size=0),
             lambda: Int8Linear.from_linear(nn.Linear(8, 8), kernel="turbo")]
    for case in cases:
        with pytest.raises(LabError) as info:
            case()
        assert _one_sentence(info.value), str(info.value)


def test_the_methods_are_a_registry_and_a_new_kernel_is_one_entry(monkeypatch):
    from labsupport.engine import quant as Q
    assert set(Q.METHODS) == {"int8", "int4", "bnb-int8", "bnb-nf4", "bnb-fp4"}
    assert all(list(m.kernels)[0] == "auto" for m in Q.METHODS.values())       # "auto" is every default
    assert [n for n, m in Q.METHODS.items() if m.group_size] == ["int4"]
    for case, words in [(lambda: quantize_model(random_model("tiny-llama"), "bnb-nf4", kernel="fast"),
                         "no kernel 'fast'; use one of auto"),
                        (lambda: quantized_replacement("int4", kernel="turbo"), "use one of auto, w4a8, fast, reference"),
                        (lambda: Q.find_method("int3"), "Unknown quantization method 'int3'")]:
        with pytest.raises(LabError, match=words) as info:
            case()
        assert _one_sentence(info.value), str(info.value)
    # another kernel of a method: one more entry in its `kernels`, and every entry point takes it
    built = []

    def traced(linear, group_size, warn):
        built.append(group_size)
        return Int4Linear.from_linear(linear, group_size=group_size, kernel="reference", warn=warn)
    int4 = Q.METHODS["int4"]
    monkeypatch.setitem(Q.METHODS, "int4", Q.Method(kernels={**int4.kernels, "traced": traced}, group_size=True))
    model = random_model("tiny-llama")
    handle = quantize_model(model, "int4", group_size=16, kernel="traced")
    assert len(built) == len(handle.swaps) > 0 and set(built) == {16} and handle.group_size == 16
    assert quantize_model(random_model("tiny-llama"), "int8", group_size=16).group_size is None   # not its option


# --- kernels ---------------------------------------------------------------------------------

def _linear(out_features=96, in_features=128, bias=True):
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(_weight(out_features, in_features))
    return linear


@pytest.mark.parametrize("make", [
    lambda lin, kernel: Int8Linear.from_linear(lin, kernel=kernel),
    lambda lin, kernel: Int4Linear.from_linear(lin, group_size=32, kernel=kernel),
    lambda lin, kernel: Int4Linear.from_linear(lin, group_size=128, kernel=kernel),   # padded: 96 -> 128
], ids=["int8", "int4-g32", "int4-g128-padded"])
def test_fast_kernel_matches_reference(make):
    linear = _linear(out_features=100, in_features=96)       # 100 rows: not a whole kernel tile
    fast, reference = make(linear, "fast"), make(linear, "reference")
    assert reference.kernel == "reference"
    x = torch.randn(3, 5, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y_fast, y_ref = fast(x), reference(x)
    assert y_fast.shape == y_ref.shape == (3, 5, 100) and y_fast.dtype == torch.float32
    scale = y_ref.abs().max()
    assert (y_fast - y_ref).abs().max() <= 0.02 * scale        # bf16 activations in the fast path
    torch.testing.assert_close(fast.dequantized_weight(), reference.dequantized_weight(), atol=2e-3, rtol=0.02)


def test_cpu_fast_kernels_are_used_here():
    linear = _linear(out_features=128, in_features=128)
    assert Int8Linear.from_linear(linear, kernel="fast").kernel == "fast"
    assert Int4Linear.from_linear(linear, group_size=32, kernel="fast").kernel == "fast"


def test_unsupported_group_size_falls_back_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = quantize_model(random_model("tiny-llama"), "int4", group_size=16, kernel="fast")
    assert handle.kernels == {"reference": len(handle.names)}
    assert len(caught) == 1 and "reference" in str(caught[0].message)


def test_quantized_bytes_are_counted_from_buffers():
    linear = _linear(out_features=128, in_features=256, bias=False)
    int8, int4 = Int8Linear.from_linear(linear), Int4Linear.from_linear(linear, group_size=32)
    fp32 = linear.weight.nbytes
    assert sum(b.nbytes for b in int8.buffers()) == pytest.approx(fp32 / 4, rel=0.02)
    assert sum(b.nbytes for b in int4.buffers()) < fp32 / 6


# --- models ----------------------------------------------------------------------------------

def _tokens(seed=0, length=24):
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantize_and_restore(family, method):
    model = random_model(family)
    tokens = _tokens()
    with torch.inference_mode():
        before = model.logits(model(tokens))
    fp32_bytes = model.weight_bytes()
    handle = quantize_model(model, method, group_size=32)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.embed.weight.dtype == torch.float32                   # the lookup keeps its float table
    assert model.weight_bytes() < fp32_bytes / (3.5 if method == "int8" else 5)
    result = generate(model, tokens[0].tolist(), 12, eos_token_ids=())
    assert result.tokens.shape == (1, 12)
    with torch.inference_mode():
        quantized = model.logits(model(tokens))
    assert torch.isfinite(quantized).all() and not torch.equal(quantized, before)
    handle.restore()
    with torch.inference_mode():
        assert torch.equal(model.logits(model(tokens)), before)
    assert model.weight_bytes() == fp32_bytes
    with handle:                                                       # apply again, undo on exit
        assert model.weight_bytes() < fp32_bytes
    assert model.weight_bytes() == fp32_bytes


def test_lm_head_can_stay_float():
    model = random_model("tiny-llama")
    handle = quantize_model(model, "int8", include_lm_head=False)
    assert type(model.lm_head) is nn.Linear and "lm_head" not in handle.names
    handle.restore()


def test_top1_agreement_and_perplexity_on_the_tiny_model():
    model, reference = random_model("tiny-llama"), random_model("tiny-llama")
    tokens = _tokens(length=64)[0]
    assert top1_agreement(reference, model, tokens) == 1.0
    with quantize_model(model, "int8"):
        assert top1_agreement(reference, model, tokens) > 0.8
    ppl = perplexity(model, ByteTokenizer(), max_tokens=128)
    assert math.isfinite(ppl) and ppl > 1


def test_kl_divergence_is_zero_for_the_same_logits_and_the_textbook_sum_otherwise():
    from labsupport.lab.quality import kl_divergence_from_logits
    torch.manual_seed(0)
    p, q = torch.randn(5, 7, 11), torch.randn(5, 7, 11)
    assert kl_divergence_from_logits(p, p) == 0.0
    assert kl_divergence_from_logits(p, p + 3.0) == pytest.approx(0.0, abs=1e-6)     # a shift is the same softmax
    P, Q = p.softmax(-1), q.softmax(-1)
    textbook = (P * (P / Q).log()).sum(-1).mean().item()
    assert kl_divergence_from_logits(p, q) == pytest.approx(textbook, rel=1e-5)
    assert kl_divergence_from_logits(p, q) != pytest.approx(kl_divergence_from_logits(q, p), rel=1e-3)  # not symmetric
    for bad in (torch.randn(5, 7, 12), torch.randn(7, 11), torch.tensor(1.0)):
        with pytest.raises(LabError, match="one shape"):
            kl_divergence_from_logits(p, bad)


def test_kl_divergence_with_minus_inf_logits_is_zero_against_itself_and_finite_otherwise():
    """Issue 50: a token of probability 0 (a -inf logit) made KL(p, p) nan; 0 log 0 adds 0."""
    from labsupport.lab.quality import kl_divergence_from_logits
    p = torch.tensor([[0.0, -math.inf, 1.0], [2.0, 0.5, -math.inf]])
    assert kl_divergence_from_logits(p, p) == 0.0
    q = torch.tensor([[0.5, 0.0, 0.0], [1.0, 1.0, 1.0]])          # q may give the impossible tokens anything
    P, Q = p.double().softmax(-1), q.double().softmax(-1)
    textbook = torch.where(P > 0, P * (P / Q).log(), torch.zeros_like(P)).sum(-1).mean().item()
    assert kl_divergence_from_logits(p, q) == pytest.approx(textbook, rel=1e-9)
    with pytest.raises(LabError, match="infinite"):              # q rules out a token p can emit
        kl_divergence_from_logits(q, p)


@pytest.mark.parametrize("reference, other, message", [
    (torch.zeros(3, 0), torch.zeros(3, 0), "one shape"),                          # an empty vocabulary: was 0
    (torch.zeros(0, 5), torch.zeros(0, 5), "one shape"),                          # no positions: was nan
    (torch.tensor([0.0, math.nan]), torch.zeros(2), "nan or \\+inf"),
    (torch.zeros(2), torch.tensor([math.inf, 0.0]), "nan or \\+inf"),
    (torch.tensor([-math.inf, -math.inf]), torch.zeros(2), "all -inf"),
    ([0.0, 1.0], torch.zeros(2), "tensors of logits"),
])
def test_kl_divergence_refuses_what_is_no_distribution_in_one_sentence(reference, other, message):
    from labsupport.lab.quality import kl_divergence_from_logits
    with pytest.raises(LabError, match=message) as error:
        kl_divergence_from_logits(reference, other)
    assert "\n" not in str(error.value)


def test_kl_divergence_orders_int8_below_int4():
    from labsupport.lab.quality import kl_divergence_from_logits, logits_of
    model = random_model("tiny-llama")
    tokens = _tokens(length=64)[0]
    reference = logits_of(model, tokens)
    kl = {}
    for method in ("int8", "int4"):
        with quantize_model(model, method):
            kl[method] = kl_divergence_from_logits(reference, logits_of(model, tokens))
    assert 0 < kl["int8"] < kl["int4"], kl


@pytest.mark.parametrize("method", ["bnb-int8", "bnb-nf4", "bnb-fp4"])
def test_bitsandbytes_layers_on_the_tiny_model(method):
    pytest.importorskip("bitsandbytes")
    model = random_model("tiny-llama")
    tokens = _tokens()
    with torch.inference_mode():
        before = model.logits(model(tokens))
    try:
        handle = quantize_model(model, method)
    except LabError as error:
        pytest.skip(f"bitsandbytes cannot run here: {error}")
    with torch.inference_mode():
        after = model.logits(model(tokens))
    assert torch.isfinite(after).all()
    assert (after - before).abs().max() < 0.5 * before.abs().max()
    assert quantized_bytes(model) < random_model("tiny-llama").weight_bytes() / 2.5
    assert generate(model, tokens[0].tolist(), 8, eos_token_ids=()).tokens.shape == (1, 8)
    handle.restore()
    with torch.inference_mode():
        assert torch.equal(model.logits(model(tokens)), before)


# --- the linear swap: every format through one function, undone exactly --------------------------

FORMATS = ["int8", "int4", "bnb-int8", "bnb-nf4", "bnb-fp4"]


def _snapshot(model):
    """Every module object, every parameter object and a copy of its values."""
    return (dict(model.named_modules()),
            {name: (p, p.detach().clone(), p.stride()) for name, p in model.named_parameters()})


def _assert_same(model, snapshot):
    modules, parameters = snapshot
    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(module is modules[name] for name, module in model.named_modules())
    for name, p in model.named_parameters():
        original, values, stride = parameters[name]
        assert p is original and torch.equal(p, values) and p.stride() == stride, name


def _swapped(method, model):
    """swap_linears with the replacement for `method`; skips where bitsandbytes cannot run here."""
    if method.startswith("bnb-"):
        pytest.importorskip("bitsandbytes")
    try:
        return swap_linears(model, quantized_replacement(method, group_size=32))
    except LabError as error:
        pytest.skip(f"bitsandbytes cannot run here: {error}")


@pytest.mark.parametrize("method", FORMATS)
def test_each_format_goes_through_the_swap_and_back(method):
    model, tokens = random_model("tiny-llama"), _tokens()
    snapshot = _snapshot(model)
    with torch.inference_mode():
        before = model.logits(model(tokens))
    handle = _swapped(method, model)
    assert isinstance(handle, SwapHandle) and len(handle.names) == 9
    assert not any(type(m) is nn.Linear for m in model.modules())
    with torch.inference_mode():
        assert not torch.equal(model.logits(model(tokens)), before)
    handle.restore()
    _assert_same(model, snapshot)
    with torch.inference_mode():
        assert torch.equal(model.logits(model(tokens)), before)
    with handle:                                            # the same replacements, applied again
        assert all(model.get_submodule(swap.name) is swap.replacement for swap in handle.swaps)
    _assert_same(model, snapshot)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_with_block_restores_even_when_the_forward_pass_raises(method):
    model, tokens = random_model("tiny-llama"), _tokens()
    snapshot = _snapshot(model)
    with torch.inference_mode():
        before = model.logits(model(tokens))

    def fail(*_):
        raise RuntimeError("a failure in the middle of the forward pass")

    hook = model.blocks[-1].register_forward_hook(fail)       # after the quantized layers of block 0 ran
    with pytest.raises(RuntimeError, match="middle of the forward pass"):
        with swap_linears(model, quantized_replacement(method)):
            with torch.inference_mode():
                model.logits(model(tokens))
    hook.remove()
    _assert_same(model, snapshot)
    with torch.inference_mode():
        assert torch.equal(model.logits(model(tokens)), before)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("method,group_size", [("int8", 32), ("int4", 32), ("int4", 16)])
def test_quantize_model_is_the_swap_with_the_quantized_replacement(family, method, group_size):
    model, tokens = random_model(family), _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # g16: the reference kernel, with a warning
        with quantize_model(model, method, group_size=group_size) as handle:
            with torch.inference_mode():
                via_quantize_model = model.logits(model(tokens))
        with swap_linears(model, quantized_replacement(method, group_size=group_size)) as swap:
            with torch.inference_mode():
                via_swap = model.logits(model(tokens))
    assert torch.equal(via_quantize_model, via_swap) and handle.names == swap.names


def test_a_replacement_that_fails_halfway_leaves_the_model_as_it_was():
    model = random_model("tiny-llama")
    snapshot, calls = _snapshot(model), []

    def replacement(name, linear):
        calls.append(name)
        if len(calls) == 4:
            raise LabError("This layer cannot be replaced.")
        return Int8Linear.from_linear(linear)

    with pytest.raises(LabError):
        swap_linears(model, replacement)
    assert len(calls) == 4
    _assert_same(model, snapshot)


def test_bitsandbytes_that_cannot_run_here_is_refused_in_one_sentence(monkeypatch):
    """An older bitsandbytes raises on a machine without CUDA: one sentence, and no layer is left swapped."""
    pytest.importorskip("bitsandbytes")
    import labsupport.engine.quant.bnb as quantize_bnb
    built = []

    def build_on_cpu(bnb, linear, kind):
        built.append(kind)
        if len(built) > 2:
            raise RuntimeError("CUDA is required but not available for bitsandbytes.\nmore lines")
        return nn.Identity()

    monkeypatch.setattr(quantize_bnb, "_build", build_on_cpu)
    model = random_model("tiny-llama")
    snapshot = _snapshot(model)
    for method in ("bnb-int8", "bnb-nf4"):
        built.clear()
        with pytest.raises(LabError) as info:
            quantize_model(model, method)
        assert _one_sentence(info.value) and "use method 'int8' or 'int4'" in str(info.value), str(info.value)
        _assert_same(model, snapshot)


def test_the_layout_is_an_argument_of_the_swap_done_in_place_and_undone():
    model, tokens = random_model("tiny-llama"), _tokens()
    snapshot = _snapshot(model)
    with torch.inference_mode():
        before = model.logits(model(tokens))
    with swap_linears(model, layout=lambda w: relayout(w, "column")) as handle:
        assert handle.swaps == [] and len(handle.restored) == 9
        assert model.lm_head.weight is model.embed.weight                     # still tied
        assert model.lm_head.weight.t().is_contiguous() and not model.lm_head.weight.is_contiguous()
        assert all(m is snapshot[0][n] for n, m in model.named_modules())     # no module replaced
        with torch.inference_mode():
            torch.testing.assert_close(model.logits(model(tokens)), before)
    _assert_same(model, snapshot)                                              # row-major again


def test_the_layout_applies_to_the_layers_a_replacement_keeps():
    model = random_model("tiny-llama")
    keep_head = quantized_replacement("int8", include_lm_head=False)
    with swap_linears(model, keep_head, layout=lambda w: relayout(w, "column")) as handle:
        assert "lm_head" not in handle.names and [r.name for r in handle.restored] == ["lm_head"]
        assert type(model.lm_head) is nn.Linear and model.lm_head.weight.t().is_contiguous()
    assert model.lm_head.weight.is_contiguous()


def test_apply_layout_keeps_its_behaviour():
    model = random_model("tiny-llama")
    weights = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    shapes = {tuple(m.weight.shape) for m in model.modules() if type(m) is nn.Linear}
    assert apply_layout(model, "column") == dict.fromkeys(shapes, "column")
    for name, p in model.named_parameters():                  # the same Parameters, the same values
        assert p is weights[name][0] and torch.equal(p, weights[name][1])
    assert model.blocks[0].mlp.down.weight.t().is_contiguous() and model.lm_head.weight is model.embed.weight
    assert apply_layout(model, "row") == dict.fromkeys(shapes, "row")
    assert model.blocks[0].mlp.down.weight.is_contiguous()


# --- the embedded model ------------------------------------------------------------------------

QUESTIONS = ["What is the capital of France?", "What is the capital of France? Answer in one sentence.",
             "Which city is the capital of France?", "Name the capital city of France."]


@pytest.mark.slow
def test_embedded_perplexity_is_sane(smollm):
    model, tokenizer = smollm
    ppl = perplexity(model, tokenizer)
    assert 2 < ppl < 200


@pytest.mark.slow
@pytest.mark.parametrize("method,group_size", [("int8", None), ("int4", 32)])
def test_embedded_model_survives_quantization(smollm, method, group_size):
    model, tokenizer = smollm
    reference_ppl = perplexity(model, tokenizer)
    tokens = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    with torch.inference_mode():
        reference_top1 = model.logits(model(torch.tensor([tokens]))).argmax(-1)
    with quantize_model(model, method, group_size=group_size or 32) as handle:
        assert handle.kernels == {"fast" if method == "int8" else "w4a8": len(handle.names)}   # W4A8 builds here
        with torch.inference_mode():
            top1 = model.logits(model(torch.tensor([tokens]))).argmax(-1)
        assert (top1 == reference_top1).float().mean() > 0.85
        assert perplexity(model, tokenizer) < reference_ppl * 1.15
        # greedy answers can flip on a near-tie (int4 g32 answers the first question with
        # "L'Etoile (The City of Lights) ..."), so most, not all, must name Paris
        answers = [generate_text(model, tokenizer, question, max_new_tokens=16) for question in QUESTIONS]
        assert sum("Paris" in answer for answer in answers) >= 3, answers
    with torch.inference_mode():
        assert torch.equal(model.logits(model(torch.tensor([tokens]))).argmax(-1), reference_top1)


@pytest.mark.slow
def test_embedded_blocks_are_already_on_a_4bit_grid(smollm):
    """The embedded weights came as Q4_1 (blocks of 32): int4 g32 reproduces a block's weights
    exactly, while the output layer (tied to the embedding, stored finer) does lose precision."""
    model, _ = smollm
    assert weight_error_stats(model.blocks[0].mlp.down.weight, "int4", 32)["relative_frobenius"] < 1e-5
    assert weight_error_stats(model.embed.weight, "int4", 32)["relative_frobenius"] > 0.01


def test_bitsandbytes_layers_are_for_inference_and_quiet_per_call(caplog):
    """bnb modules in eval mode with no gradients, and LLM.int8() given fp16 itself: no
    "inputs will be cast" line per call (bitsandbytes logs one per layer per step otherwise)."""
    pytest.importorskip("bitsandbytes")
    import logging
    model = random_model("tiny-llama")
    try:
        quantize_model(model, "bnb-int8")
    except LabError as error:
        pytest.skip(f"bitsandbytes cannot run here: {error}")
    layers = [m for m in model.modules() if "bitsandbytes" in kernel_description(m)]
    assert layers and all(not m.training for m in layers)
    assert all(not p.requires_grad for m in layers for p in m.parameters())
    assert kernel_description(layers[0]) == "bitsandbytes Linear8bitLt"
    with caplog.at_level(logging.WARNING):
        generate(model, _tokens()[0].tolist(), 4, eos_token_ids=())
    assert not [r for r in caplog.records if "cast" in r.getMessage()], [r.getMessage() for r in caplog.records]
def test_the_layout_module_keeps_no_module_state():
    """The measured layouts are a pure function of (device type, dtype, shape), remembered by
    functools.cache; the module assigns nothing after import."""
    import types
    from labsupport.engine.models import layout
    state = [name for name, value in vars(layout).items() if not name.startswith("__")
             and isinstance(value, (dict, list, set)) and not isinstance(value, types.ModuleType)]
    assert state == []
    first = layout.preferred_layout("cpu", torch.float32, (1536, 576))
    assert first in layout.LAYOUTS and layout.measured_layout.cache_info().currsize >= 1
    assert layout.preferred_layout("cpu", torch.float32, (1536, 576)) == first      # measured once, the same
    assert layout.preferred_layout("cpu", torch.float32, (8, 8)) == "row"            # cache-sized: never timed
