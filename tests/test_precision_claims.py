"""Notebook 03's claims table: each 16-bit format judged by its own measurement, speed verdicts
withheld on a busy machine, and the conclusions written from the verdicts."""

from types import SimpleNamespace

import pytest
import torch

import labsupport.claims.precision as claims
from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims.precision import precision_claims, speed_verdict, summarize_verdicts, verdict_kind
from labsupport.lab.measure import Timing

GPT2_MIB = {"float32": 474.7002, "float16": 237.3501}
QUIET = Timing([1.00, 1.01, 0.99]).to_dict()
NOISY = Timing([1.0, 2.0, 1.1]).to_dict()


def speed(ratio, timing=QUIET, load=1.0, note=""):
    fp32 = Timing([s * ratio for s in timing["samples"]]).to_dict()
    return {"speedup": ratio, "seconds": timing["median"], "fp32_seconds": fp32["median"], "note": note,
            "timing": timing, "fp32_timing": fp32, "load": load}


def lab(speeds, agreements=None, memory=None):
    """A stand-in for `explorers.precision.PrecisionLab`: what precision_claims reads."""
    memory = memory or {"float32": 1000, "bfloat16": 500, "float16": 500}
    return SimpleNamespace(device=torch.device("cpu"), speeds=speeds, memory=lambda: memory,
                           agreements=agreements or {}, reference=SimpleNamespace(config=SimpleNamespace(name="m")))


@pytest.fixture(autouse=True)
def a_cpu_with_bf16_and_emulated_fp16(monkeypatch):
    monkeypatch.setattr(claims, "precision_choices", lambda device: ["float32", "bfloat16", "float16"])
    monkeypatch.setattr(claims, "emulation_note", lambda device, dtype: (
        "emulated: this CPU has no fp16 (AMX-FP16) instructions" if dtype == "float16" else ""))
    monkeypatch.setattr(claims, "dtype_label", lambda device, dtype: str(dtype))


def row(rows, topic, fmt):
    return next(r for r in rows if r["topic"] == topic and r["format"] == fmt)


def test_fp16_is_judged_by_its_own_timing_never_by_bf16s():
    rows = precision_claims(lab({("decode", "bfloat16"): speed(1.4)}), GPT2_MIB)
    assert row(rows, "speed (decode)", "bf16")["verdict"] == "holds on this CPU"
    fp16 = row(rows, "speed (decode)", "fp16")
    assert fp16["verdict"] == "not timed here" and "AMX-FP16" in fp16["measured"] and "1.40" not in fp16["measured"]


def test_a_skipped_timing_says_why():
    skipped = {"speedup": None, "seconds": None, "fp32_seconds": None, "note": "skipped: a long prefill"}
    rows = precision_claims(lab({("prefill", "float16"): skipped}), GPT2_MIB)
    assert row(rows, "speed (prefill)", "fp16")["measured"] == "skipped: a long prefill"


@pytest.mark.parametrize("ratio, verdict", [(1.5, "holds on this CPU"), (2.5, "more on this CPU"),
                                            (1.1, "partly on this CPU: faster, but less than claimed"),
                                            (0.8, "not on this CPU")])
def test_speed_verdicts(ratio, verdict):
    assert speed_verdict(ratio, "cpu") == verdict
    rows = precision_claims(lab({("decode", "bfloat16"): speed(ratio)}), GPT2_MIB)
    assert row(rows, "speed (decode)", "bf16")["verdict"] == verdict


def test_a_busy_machine_gets_no_speed_verdict():
    noisy = precision_claims(lab({("decode", "bfloat16"): speed(1.5, timing=NOISY)}), GPT2_MIB)
    assert row(noisy, "speed (decode)", "bf16")["verdict"].startswith(BUSY_VERDICT)
    loaded = precision_claims(lab({("decode", "bfloat16"): speed(1.5, load=3.0)}), GPT2_MIB)
    assert "load average was 3.0" in row(loaded, "speed (decode)", "bf16")["verdict"]
    told = precision_claims(lab({("decode", "bfloat16"): speed(1.5, load=3.0)}), GPT2_MIB, load=1.0)
    assert row(told, "speed (decode)", "bf16")["verdict"] == "holds on this CPU"


def test_memory_and_quality_verdicts():
    half = precision_claims(lab({}), GPT2_MIB)
    assert row(half, "memory", "bf16, fp16")["verdict"].startswith("holds")
    fat = precision_claims(lab({}, memory={"float32": 1000, "bfloat16": 600}), GPT2_MIB)
    assert fat[0]["verdict"] == "partly: the counted tensors are not half of fp32's"
    decimal = precision_claims(lab({}), {"float32": 474.7002, "float16": 237.3})
    assert decimal[0]["verdict"] == "partly: GPT-2's count differs from the chapter's"
    agreements = {"float16": {"top1_agreement": 0.99, "mean_abs_diff": 0.01, "max_abs_diff": 0.1},
                  "bfloat16": {"top1_agreement": 0.90, "mean_abs_diff": 0.05, "max_abs_diff": 0.5}}
    rows = precision_claims(lab({}, agreements), GPT2_MIB)
    assert row(rows, "quality", "fp16")["verdict"] == "holds"
    assert row(rows, "quality", "bf16")["verdict"].startswith("partly")


def test_the_conclusions_are_written_from_the_verdicts():
    rows = [{"topic": "memory", "format": "bf16", "verdict": "holds (the chapter's MB are MiB)"},
            {"topic": "speed", "format": "bf16", "verdict": "partly on this CPU: faster"},
            {"topic": "speed", "format": "fp16", "verdict": "not timed here"},
            {"topic": "speed", "format": "fp32?", "verdict": f"{BUSY_VERDICT} (load)"},
            {"topic": "quality", "format": "fp16", "verdict": "not on this CPU"}]
    text = summarize_verdicts(rows)
    assert "* **memory**: the claim holds for bf16." in text
    assert ("* **speed**: the claim holds only in part for bf16; was not measured here for fp16; gets no verdict "
            "(the machine was busy: re-run) for fp32?.") in text
    assert "* **quality**: the claim does not hold for fp16." in text
    assert [verdict_kind(v) for v in ("more on this GPU", "not measured here", "holds (less loss)")] == \
        ["holds", "untimed", "holds"]
