"""Mixed precision tools: footprints from real tensors, overflow, agreement, bf16 support."""

import math

import pytest
import torch

from labsupport.errors import LabError, UnsupportedDtype
from labsupport.engine.config import PRESETS
from labsupport.weights.fixtures import random_model
from labsupport.lab.precision import (as_dtype, autocast_logits, bf16_report, first_overflow,
                                      logit_agreement, overflow_demo, parameter_bytes)
from labsupport.engine.precision import cast_model, tensor_bytes

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def test_half_precision_halves_the_tensors():
    model = random_model("tiny-llama")
    assert tensor_bytes(cast_model(model, "bf16")) * 2 == tensor_bytes(model)
    assert next(model.parameters()).dtype == torch.float32          # the original is untouched


def test_cast_model_casts_the_whole_model_in_a_copy_not_a_linear_swap():
    """Embeddings, norms and position tables are cast too (a linear swap would cast only the
    Linear layers), in new modules: the original keeps every module and fp32 tensor."""
    model = random_model("tiny-llama")
    half = cast_model(model, "bf16")
    tensors = list(half.parameters()) + list(half.buffers())
    assert {t.dtype for t in tensors if t.is_floating_point()} == {torch.bfloat16}
    assert half.embed.weight.dtype == half.final_norm.weight.dtype == half.rope_cos.dtype == torch.bfloat16
    assert half.lm_head.weight is half.embed.weight                  # still tied in the copy
    assert not {id(m) for m in half.modules()} & {id(m) for m in model.modules()}
    assert {t.dtype for t in model.parameters()} == {torch.float32}


def test_gpt2_footprint_matches_the_chapter():
    n = PRESETS["gpt2"].num_parameters
    assert parameter_bytes(n, "float32") / 2**20 == pytest.approx(474.7, abs=0.05)
    assert parameter_bytes(n, "float16") / 2**20 == pytest.approx(237.4, abs=0.05)


def test_fp16_overflows_where_bf16_does_not():
    rows = {r["x"]: r for r in overflow_demo()}
    assert math.isinf(rows[256.0]["x*x (float16)"]) and math.isfinite(rows[256.0]["x*x (bfloat16)"])
    assert rows[100.0]["x*x (float16)"] == 10000.0
    assert first_overflow(torch.tensor([1.0, 7e4, 1e5])) == 1
    assert first_overflow(torch.tensor([1.0, 2.0])) is None


def test_agreement_of_a_model_with_itself_and_with_bf16():
    model = random_model("tiny-gpt2")
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    same = logit_agreement(model, model, tokens)
    assert same["max_abs_diff"] == 0 and same["top1_agreement"] == 1.0
    bf16 = logit_agreement(model, cast_model(model, "bfloat16"), tokens)
    assert 0 < bf16["max_abs_diff"] < 0.1
    auto = autocast_logits(model, tokens, "bfloat16")
    assert auto.dtype == torch.float32 and auto.shape == (1, 12, 260)


def test_bf16_on_a_t4_is_refused_although_the_framework_says_yes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    report = bf16_report("cuda")
    assert report == {"device": "cuda", "framework_says": True, "hardware_has": False}


def test_unknown_precision_is_one_sentence():
    with pytest.raises(LabError, match="Unknown precision 'fp12'"):
        as_dtype("fp12")
    assert as_dtype("bf16") == as_dtype("torch.bfloat16") == torch.bfloat16     # one parser, every spelling
    with pytest.raises(LabError, match="int3 cannot be a model dtype"):         # a torch dtype, not a model's
        cast_model(random_model("tiny-llama"), "int3")


def test_bf16_without_bf16_instructions_is_emulated_not_refused(monkeypatch):
    """The common AVX2 laptop: casting to bf16 works, stores the same bits as on bf16
    hardware, and is labelled emulated everywhere its speed is shown."""
    from labsupport.engine import hardware
    from labsupport.lab import precision
    monkeypatch.setenv(hardware.NO_BF16_SWITCH, "1")
    model = random_model("tiny-llama")
    half = cast_model(model, "bfloat16")
    assert next(half.parameters()).dtype == torch.bfloat16
    assert tensor_bytes(half) * 2 == tensor_bytes(model)
    assert precision.precision_choices("cpu") == ["float32", "bfloat16", "float16"]
    assert hardware.dtype_label("cpu", torch.bfloat16) == "bfloat16 (emulated)"
    assert "no bf16" in precision.emulation_note("cpu", "bfloat16")
    monkeypatch.delenv(hardware.NO_BF16_SWITCH)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert hardware.dtype_label("cpu", torch.bfloat16) == "bfloat16"
    assert precision.emulation_note("cpu", "bfloat16") == ""


def test_bf16_on_a_gpu_without_bf16_units_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    from labsupport.lab import precision
    assert precision.precision_choices("cuda") == ["float32", "float16"]
    with pytest.raises(UnsupportedDtype, match="Tesla T4"):
        hardware_check("cuda", torch.bfloat16)


def hardware_check(device, dtype):
    from labsupport.engine.hardware import require_usable_dtype
    require_usable_dtype(device, dtype)


def test_the_tables_and_the_blocks_add_up_to_the_parameters():
    from labsupport.lab.precision import block_parameters, table_parameters
    gpt2, llama = PRESETS["gpt2"], PRESETS["llama-7b-shape"]
    assert table_parameters(gpt2) == 50257 * 768 + 1024 * 768                 # tied: the embedding once, positions
    assert table_parameters(llama) == 2 * 32000 * 4096                         # its own output layer
    assert table_parameters(gpt2.with_(tie_embeddings=False)) == table_parameters(gpt2) + 50257 * 768
    for config in (gpt2, llama, PRESETS["smollm2-135m"]):
        assert block_parameters(config) + table_parameters(config) == config.num_parameters
    model = random_model("tiny-gpt2")
    assert block_parameters(model.config) == sum(p.numel() for n, p in model.named_parameters()
                                                 if not n.startswith(("embed", "position", "lm_head")))


def test_spacing_is_the_step_to_the_next_number():
    from labsupport.lab.precision import spacing
    assert spacing(22000, "bfloat16") == 128 and spacing(22000, "float16") == 16
    assert spacing(1.0, "bfloat16") == 2.0**-7 and spacing(-1.0, "float32") == 2.0**-23


def test_a_16_bit_running_sum_stalls_where_an_fp32_one_does_not():
    from labsupport.lab.precision import matmul_accumulate
    ones = torch.ones(2, 1024, dtype=torch.bfloat16)
    assert matmul_accumulate(ones, ones.t(), torch.bfloat16).unique().tolist() == [256.0]
    fp32 = matmul_accumulate(ones, ones.t(), torch.float32)
    assert fp32.dtype == torch.bfloat16 and fp32.unique().tolist() == [1024.0]
    a = torch.randn(3, 40, dtype=torch.float16)
    b = torch.randn(40, 5, dtype=torch.float16)
    assert torch.allclose(matmul_accumulate(a, b, "fp32").float(), a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    with pytest.raises(LabError, match="two float matrices"):
        matmul_accumulate(a, b.float(), torch.float32)


def test_format_bits_figure_draws_each_format_to_scale():
    from labsupport.plots.precision import format_bits_figure
    from labsupport.lab.precision import format_bits
    fig = format_bits_figure([format_bits(d) for d in ("float32", "float16", "bfloat16")])
    widths = {t.name: list(t.x) for t in fig.data}
    assert widths == {"sign": [1, 1, 1], "exponent": [8, 5, 8], "mantissa": [7, 10, 23]}
    assert list(fig.data[0].y) == ["bfloat16", "float16", "float32"]
