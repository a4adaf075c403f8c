"""The quantization and precision benchmark sections (notebooks 03 and 04) on the tiny model:
the footprint beside the bytes read, a busy reason on every speed ratio, the kernel named."""

import pytest
import torch

from labsupport.bench.core import BenchContext
from labsupport.bench.precision import PrecisionOptions
from labsupport.bench.quantization import QuantizationOptions

QUANT = QuantizationOptions(new_tokens=4, slow_new_tokens=3, repeats=1, eval_tokens=24)
PRECISION = PrecisionOptions(new_tokens=3, prefill_tokens=16, repeats=1)


@pytest.fixture(scope="module")
def context():
    return BenchContext(torch.device("cpu"), model_name="tiny-llama")


def test_quantization_reports_the_footprint_and_the_bytes_read(context):
    from labsupport.bench.quantization import section_quantization
    section = section_quantization(context, QUANT)
    rows, figures = section["rows"], {f["name"]: f for f in section["figures"]}
    for name in ("int8", "int4 g32"):
        row = rows[name]
        assert row["resident_fraction"] > row["memory_fraction"]          # the tied embedding stays float
        assert "claim" not in figures[f"{name} resident bytes / fp32"]    # the claims are the claims table's
        # int8: aten's fused kernel; int4 with groups of 32: our W4A8 kernel, which builds here
        assert row["kernel"].startswith("fused int8 kernel" if name == "int8" else "W4A8 kernel of our own")
        speed = figures[f"{name} / fp32 decode speed (batch 1)"]
        assert "busy" in speed and row["kernel"] in speed["note"]
    assert rows["bf16"]["resident_fraction"] == pytest.approx(0.5)
    for name, figure in figures.items():                                 # vs bf16: our own int8/int4 rows only
        if "/ bf16 decode speed" in name:
            assert name.split(" /")[0] in ("int8", "int4 g32", "int4 g128")


def test_each_speed_ratio_carries_the_busy_reason_of_its_own_two_timings(context, monkeypatch):
    import labsupport.bench.precision as bench_precision
    import labsupport.bench.quantization as bench_quantization
    for module in (bench_precision, bench_quantization):
        monkeypatch.setattr(module, "busy_reason", lambda timings, **kw: "noisy " + " and ".join(sorted(timings)))
    precision = bench_precision.section_precision(context, PRECISION)
    speeds = [f for f in precision["figures"] if "speed" in f["name"]]
    assert speeds and all(f["busy"] in ("noisy bfloat16 and float32", "noisy float16 and float32")
                          and f["busy"].split()[1] in f["name"].replace("(emulated) ", "") and f["met"] is None
                          for f in speeds)
    quantization = bench_quantization.section_quantization(context, QUANT)
    figure = next(f for f in quantization["figures"] if f["name"] == "int8 / fp32 decode speed (batch 1)")
    assert figure["busy"] == "noisy fp32 and int8" and figure["met"] is None


def test_one_fp32_model_is_loaded_and_every_section_shares_its_variants(monkeypatch):
    """BenchContext reads the model from disk once, in fp32; every other precision and every
    quantized row is the run's `ModelVariants`' copy, which the claims then judge from the JSON."""
    import labsupport.bench.core as core
    from labsupport.bench.quantization import section_quantization
    from labsupport.claims import quantization_section_claims
    loads = []
    real = core.load_model
    monkeypatch.setattr(core, "load_model", lambda *a, **k: loads.append(k.get("dtype")) or real(*a, **k))
    ctx = BenchContext(torch.device("cpu"), model_name="tiny-llama")
    half = ctx.model(torch.bfloat16)[0]
    assert half.dtype == torch.bfloat16 and half is ctx.variants.get("bf16") and loads == [torch.float32]
    section = section_quantization(ctx, QUANT)
    assert loads == [torch.float32]                                     # nothing else read from disk
    assert section["rows"]["int4 g32"]["kernels"] == ctx.variants.handle("fp32", "int4").kernels
    assert ctx.variants.get("fp32", "int4", group_size=128) is not ctx.variants.get("fp32", "int4")
    claims = quantization_section_claims(section)
    assert {c["weights"] for c in claims} >= {"bf16", "int8", "int4 g32", "int4 g128"}
    assert all(c["verdict"] for c in claims) and {c["topic"] for c in claims} == {"memory", "decode speed", "quality"}
