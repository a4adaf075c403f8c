"""Notebook 00 (where the time goes): cost counts, the ridge batch, figures, explorer (its
checkers: tests/test_checkers.py)."""

import math

import pytest
import torch

from labsupport.explorers.roofline import roofline_explorer
from labsupport.measure import HardwareProfile
from labsupport.models.config import PRESETS
from labsupport.plots.roofline import roofline_figure, step_time_figure
from labsupport import roofline
from labsupport.claims import roofline_claims
from labsupport.tables import records_table

TINY = PRESETS["tiny-llama"]


@pytest.fixture
def fake_profile():
    return HardwareProfile(device="cpu", name="fake CPU", bandwidth=10e9, flops={"float32": 100e9})


def test_decode_step_cost_by_hand():
    # tiny-llama: hidden 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128, vocab 260, tied.
    per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128          # qkv + out + gate/up/down
    assert roofline.matmul_params(TINY) == 2 * per_layer + 260 * 64 == 90368
    cost = roofline.decode_step_cost(TINY, batch=2, context=10, dtype=torch.float32)
    assert cost.flops == 2 * 90368 * 2 + 4 * 2 * 4 * 16 * 10 * 2
    weights = 2 * (per_layer + 2 * 64) + 260 * 64 + 64                 # + norms, tied embedding once
    assert cost.weight_bytes == 4 * weights
    assert cost.kv_bytes == 2 * 2 * 2 * 16 * 10 * 2 * 4
    assert cost.bytes == cost.weight_bytes + cost.kv_bytes
    assert cost.intensity == pytest.approx(cost.flops / cost.bytes)
    # bytes per value as an int gives the same as the dtype
    assert roofline.decode_step_cost(TINY, 2, 10, 2) == roofline.decode_step_cost(TINY, 2, 10, torch.bfloat16)


def test_weight_bytes_match_the_model(tiny_model):
    assert roofline.decode_step_cost(tiny_model.config, 1, 0).weight_bytes == tiny_model.weight_bytes()


def test_linear_cost():
    cost = roofline.linear_cost(30, 20, batch=4, dtype=torch.bfloat16)
    assert cost.flops == 2 * 30 * 20 * 4
    assert cost.bytes == 2 * (30 * 20 + 4 * (20 + 30))
    assert cost.kv_bytes == 0


def test_ridge_batch_math(fake_profile):
    # ridge 10 FLOP/B; at context 0 the step's intensity is 2 P B / W, so B = 10 W / (2 P)
    one = roofline.decode_step_cost(TINY, 1, 0)
    expected = 10 * one.weight_bytes / (2 * roofline.matmul_params(TINY))
    assert roofline.ridge_batch(fake_profile, TINY, torch.float32) == pytest.approx(expected)
    assert roofline.ridge_batch(fake_profile, TINY, "float32") == pytest.approx(expected)   # a dtype name works too
    at_ridge = roofline.decode_step_cost(TINY, 1, 0).flops * expected / one.weight_bytes
    assert at_ridge == pytest.approx(10)
    # with a cache the batch is larger, and an enormous ridge is never reached
    assert roofline.ridge_batch(fake_profile, TINY, torch.float32, context=100) > expected
    huge = HardwareProfile(device="cpu", name="x", bandwidth=1.0, flops={"float32": 1e6})
    assert math.isinf(roofline.ridge_batch(huge, TINY, torch.float32, context=200))


def test_growth_batch():
    rows = [{"batch": b, "seconds": s} for b, s in [(1, 1.0), (2, 1.1), (4, 1.4), (8, 2.0)]]
    assert roofline.growth_batch(rows) == 8
    assert roofline.growth_batch(rows[:3]) is None


def test_decode_measurement_runs(tiny_llama):
    rows = roofline.sweep_decode(tiny_llama, [1, 3], context=5, repeats=1)
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        assert row["seconds"] > 0 and row["dtype"] == "float32"
        assert row["tokens_per_s"] == pytest.approx(row["batch"] / row["seconds"])
    assert rows[1]["intensity"] > rows[0]["intensity"]
    lin = roofline.sweep_linear(16, 8, [1, 4], device="cpu", repeats=1)
    assert lin[1]["flops"] == 2 * 16 * 8 * 4


def test_roofline_figure_traces(fake_profile):
    profile = HardwareProfile(device="cpu", name="fake", bandwidth=10e9,
                              flops={"float32": 100e9, "bfloat16": 400e9})
    points = [{"intensity": 1.0, "flops_per_s": 5e9, "dtype": "float32", "group": "decode"},
              {"intensity": 8.0, "flops_per_s": 60e9, "dtype": "float32", "group": "decode"},
              {"intensity": 30.0, "flops_per_s": 90e9, "dtype": "float32", "group": "linear"}]
    fig = roofline_figure(profile, points)
    names = [t.name for t in fig.data]
    assert sum(n.startswith("roof") for n in names) == 2
    assert "ridge, float32" in names and "decode" in names and "linear" in names
    roof = fig.data[0]
    assert roof.y[1] == pytest.approx(100e9) and roof.x[1] == pytest.approx(10.0)   # the ridge
    assert fig.layout.xaxis.type == "log" and "FLOP/byte" in fig.layout.xaxis.title.text


def test_step_time_figure_traces():
    rows = [{"batch": b, "seconds": 0.01 * b ** 0.5, "tokens_per_s": b / (0.01 * b ** 0.5), "dtype": d}
            for d in ("float32", "bfloat16") for b in (1, 2, 4)]
    fig = step_time_figure(rows, highlight=rows[0])
    assert len(fig.data) == 2 * 2 + 2
    assert list(fig.data[0].y) == pytest.approx([10.0, 10 * 2 ** 0.5, 20.0])   # ms
    assert "ms" in fig.layout.yaxis.title.text and "tokens/s" in fig.layout.yaxis2.title.text


def test_explorer_moves_the_point(tiny_llama, fake_profile):
    explorer = roofline_explorer(tiny_llama, fake_profile, batches=[1, 2, 4], context=4, repeats=1,
                                 use_widget=False)
    assert set(explorer.controls) == {"batch", "dtype"}
    assert explorer.controls["batch"].continuous_update is False
    assert list(explorer.controls["dtype"].options) == ["float32"]

    def current_point():
        trace = [t for t in explorer.figures[0].figure.data if t.name == "current setting"][0]
        return trace.x[0]

    before = current_point()
    explorer.controls["batch"].value = 4
    assert current_point() > before                    # a bigger batch sits further right
    assert len(explorer.figures[1].figure.data[0].x) == 2   # batches 1 and 4 measured
    explorer.controls["batch"].value = 1                # cached: instant, same point back
    assert current_point() == pytest.approx(before)


def test_explorer_as_figure_widget(tiny_llama, fake_profile):
    explorer = roofline_explorer({"float32": tiny_llama}, fake_profile, batches=[1, 2], context=2,
                                 repeats=1, use_widget=True)
    old = [list(t.x) for t in explorer.figures[1].figure.data]
    explorer.controls["batch"].value = 2
    assert [list(t.x) for t in explorer.figures[1].figure.data] != old


def test_roofline_claims(fake_profile):
    # flat up to batch 4, then time grows with the batch: both claims hold
    seconds = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.014, 16: 0.025, 32: 0.050}
    rows = []
    for batch, s in seconds.items():
        cost = roofline.decode_step_cost(TINY, batch, 0)
        rows.append(roofline._row(batch, s, cost, torch.float32))
    checks = roofline_claims(rows, fake_profile)
    assert [c["verdict"] for c in checks] == ["holds", "holds", "less here"]
    table = roofline.markdown_table(checks)
    assert table.count("\n") == 4 and "| claim |" in table
    assert table == records_table(checks)                     # the one table format, labsupport.tables

