"""Notebook 03 (mixed precision): figures, the lab's caching, the explorer (its checkers:
tests/test_checkers.py)."""

import math

import numpy as np
import pytest
import torch

from labsupport.explorers.precision import PrecisionLab, precision_explorer
from labsupport.engine.config import PRESETS
from labsupport.plots.precision import agreement_figure, memory_figure, overflow_figure, speed_figure
from labsupport.lab import precision
from labsupport.lab.workloads import PrecisionWorkload

TINY_WORK = PrecisionWorkload(decode_tokens=3, prefill_tokens=24, agreement_tokens=12, repeats=1)


@pytest.fixture(scope="module")
def tiny_lab(tiny_llama):
    return PrecisionLab(tiny_llama, prompt_ids=[1, 2, 3, 4], workload=TINY_WORK)


# --- the reference functions -----------------------------------------------------------

def test_footprint_and_format_bits():
    assert precision.footprint_mib(PRESETS["gpt2"], torch.float32) == pytest.approx(474.7, abs=0.05)
    assert precision.footprint_mib(PRESETS["gpt2"], "bf16") == pytest.approx(237.4, abs=0.05)
    bits = {d: precision.format_bits(d) for d in ("fp32", "fp16", "bf16")}
    assert [(b["exponent_bits"], b["mantissa_bits"]) for b in bits.values()] == [(8, 23), (5, 10), (8, 7)]
    assert bits["fp16"]["max"] == 65504


def test_first_square_overflow_and_squares():
    assert precision.first_square_overflow(torch.tensor([3.0, -300.0, 500.0])) == 1
    assert precision.first_square_overflow([1.0, 255.0]) is None
    curve = precision.squares_by_dtype([100.0, 300.0])
    assert curve["float16"][0] == 10000.0 and math.isinf(curve["float16"][1])
    assert math.isfinite(curve["bfloat16"][1]) and curve["float32"][1] == 90000.0


def test_bf16_by_capability():
    assert not precision.bf16_in_hardware(precision.KNOWN_GPUS["T4 (Colab's free GPU)"])
    assert precision.bf16_in_hardware((8, 0)) and precision.bf16_in_hardware((9, 0))


def test_skip_reason_only_for_fp16_prefill_without_fp16_units(monkeypatch):
    monkeypatch.setattr(precision, "fp16_fast", lambda device: False)
    assert "emulated" in precision.speed_skip_reason("cpu", torch.float16, "prefill")
    assert precision.speed_skip_reason("cpu", torch.float16, "decode") is None
    assert precision.speed_skip_reason("cpu", torch.bfloat16, "prefill") is None


# --- figures ----------------------------------------------------------------------------

def test_memory_figure():
    rows = [{"model": "counted", "dtype": d, "mib": m} for d, m in [("float32", 474.7), ("bfloat16", 237.4)]]
    rows.append({"model": "the handbook chapter", "dtype": "float32", "mib": 474.7})
    fig = memory_figure(rows, highlight="bfloat16")
    assert [t.name for t in fig.data] == ["counted", "the handbook chapter"]
    assert list(fig.data[0].y) == [474.7, 237.4] and list(fig.data[0].marker.line.width) == [0, 3]
    assert "MiB" in fig.layout.yaxis.title.text


def test_speed_figure_with_a_skipped_bar():
    rows = [{"regime": "decode", "dtype": "float32", "speedup": 1.0},
            {"regime": "decode", "dtype": "bfloat16", "speedup": 1.4},
            {"regime": "prefill", "dtype": "float32", "speedup": 1.0},
            {"regime": "prefill", "dtype": "bfloat16", "speedup": 2.5},
            {"regime": "prefill", "dtype": "float16", "speedup": None, "note": "skipped: emulated"}]
    fig = speed_figure(rows, highlight=("prefill", "bfloat16"))
    assert [t.name for t in fig.data] == ["float32", "bfloat16", "float16"]
    assert list(fig.data[1].y) == [1.4, 2.5] and fig.data[2].text == ("skipped",)
    assert any("emulated" in a.text for a in fig.layout.annotations)
    assert "fp32" in fig.layout.yaxis.title.text


def test_agreement_figure():
    results = {"bfloat16": {"abs_diff": np.array([0.0, 0.01, 0.02, 0.5]), "top1_agreement": 0.9,
                            "max_abs_diff": 0.5},
               "float16": {"abs_diff": np.array([0.001, 0.002]), "top1_agreement": 1.0, "max_abs_diff": 0.002}}
    fig = agreement_figure(results, highlight="float16")
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == 2 and sum(lines[0].y) == pytest.approx(1.0)     # shares of all logits
    assert list(fig.data[-1].y) == [0.9, 1.0]
    assert fig.layout.xaxis.type == "log" and "logit" in fig.layout.xaxis.title.text


def test_overflow_figure():
    fig = overflow_figure(precision.squares_by_dtype(np.linspace(1, 400, 50)))
    names = [t.name for t in fig.data]
    assert "float16: inf (overflow)" in names and "float32" in names
    fp16 = [t for t in fig.data if t.name == "float16"][0]
    assert np.isnan(fp16.y[-1]) and fp16.y[0] == pytest.approx(1.0)
    assert any("65504" in (a.text or "") for a in fig.layout.annotations)


# --- the lab and the explorer -----------------------------------------------------------

def test_lab_measures_once_and_skips_fp16_prefill(tiny_lab, monkeypatch):
    monkeypatch.setattr(precision, "fp16_fast", lambda device: False)
    first = tiny_lab.speed("prefill", ["float32", "float16"])
    assert first["float32"]["speedup"] == 1.0 and first["float16"]["speedup"] is None
    assert tiny_lab.speed("prefill", ["float16"]) is not None
    memory = tiny_lab.memory(["float32", "float16"])
    assert memory["float16"] * 2 == memory["float32"]
    agreement = tiny_lab.agreement("float16")
    assert agreement["abs_diff"].size == TINY_WORK.agreement_tokens * 260
    assert tiny_lab.agreement("float16") is agreement                       # cached


def test_explorer_redraws_on_a_new_setting(tiny_lab):
    explorer = precision_explorer(tiny_lab, use_widget=False)
    assert set(explorer.controls) == {"dtype", "regime"}
    assert "float32" in explorer.controls["dtype"].options
    speed = lambda: [(t.name, tuple(t.x), tuple(t.y)) for t in explorer.figures[1].figure.data]   # noqa: E731
    before = speed()
    explorer.controls["regime"].value = "prefill"
    explorer.controls["dtype"].value = "float32"
    after = speed()
    assert after != before
    assert any("prefill" in x for _, xs, _ in after for x in xs)
    outlines = explorer.figures[0].figure.data[0].marker.line.width
    assert outlines[list(explorer.controls["dtype"].options).index("float32")] == 3


def test_explorer_as_figure_widget(tiny_gpt2):
    explorer = precision_explorer(tiny_gpt2, prompt_ids=[5, 6], workload=TINY_WORK, use_widget=True)
    old = [t.to_plotly_json().get("y") for t in explorer.figures[1].figure.data]
    explorer.controls["regime"].value = "prefill"
    assert [t.to_plotly_json().get("y") for t in explorer.figures[1].figure.data] != old
