"""Notebook 00 (where the time goes): cost counts, the ridge batch, figures, explorer (its
checkers: tests/test_checkers.py)."""

import math

import pytest
import torch

from labsupport.explorers.roofline import roofline_explorer
from labsupport.errors import LabError
from labsupport.lab.measure import Timing
from labsupport.lab.roofs import HardwareProfile
from labsupport.engine.config import PRESETS
from labsupport.plots.roofline import matvec_matmul_figure, roofline_figure, step_time_figure, sweep_points
from labsupport.lab import roofline
from labsupport.claims import roofline_claims
from labsupport.lab.tables import records_table

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


@pytest.mark.parametrize("dtype, size", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_linear_intensity_is_two_times_batch_per_byte_per_value(dtype, size):
    # lm_head's shape: the weight dominates the bytes at small batch, so I ~ 2 B / bytes-per-value
    for batch in (1, 4, 16):
        cost = roofline.linear_cost(49152, 576, batch, dtype)
        assert cost.intensity == pytest.approx(2 * batch / size, rel=0.03)
        assert cost.intensity != pytest.approx(batch / size, rel=0.3)        # the factor 2 is there
    huge = roofline.linear_cost(49152, 576, 10 ** 7, dtype)                   # activations dominate
    assert huge.intensity == pytest.approx(2 * 49152 * 576 / (49152 + 576) / size, rel=0.01)


def test_decode_intensity_is_two_times_batch_per_byte_per_value_at_short_context():
    for batch in (1, 8):
        assert roofline.decode_step_cost(PRESETS["smollm2-135m"], batch, 0, 4).intensity == \
            pytest.approx(2 * batch / 4, rel=0.02)


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


def test_attention_intensity_does_not_grow_with_the_batch():
    smollm2 = PRESETS["smollm2-135m"]                                   # 9 query heads, 3 key-value heads
    assert roofline.attention_intensity(smollm2, torch.float32) == pytest.approx(2 * 3 / 4)
    assert roofline.attention_intensity(smollm2, torch.bfloat16) == pytest.approx(2 * 3 / 2)
    # at a very long context every batch's step tends to the attention's intensity
    for batch in (1, 64):
        long = roofline.decode_step_cost(smollm2, batch, 10 ** 7, torch.float32)
        assert long.intensity == pytest.approx(1.5, rel=0.01)
    # so a ridge above it is never reached at a long context, while a short one is reached
    profile = HardwareProfile(device="cpu", name="x", bandwidth=10e9, flops={"float32": 80e9})   # ridge 8
    assert math.isfinite(roofline.ridge_batch(profile, smollm2, torch.float32, context=64))
    assert math.isinf(roofline.ridge_batch(profile, smollm2, torch.float32, context=8192))
    # the context where that changes: finite ridge batch just below it, none just above
    longest = roofline.ridge_context(profile, smollm2, torch.float32)
    assert 64 < longest < 8192
    assert math.isfinite(roofline.ridge_batch(profile, smollm2, torch.float32, context=int(longest * 0.99)))
    assert math.isinf(roofline.ridge_batch(profile, smollm2, torch.float32, context=int(longest * 1.01) + 1))
    # a ridge below attention's intensity is reached at any context
    low = HardwareProfile(device="cpu", name="y", bandwidth=10e9, flops={"float32": 10e9})          # ridge 1
    assert math.isinf(roofline.ridge_context(low, smollm2, torch.float32))
    assert math.isfinite(roofline.ridge_batch(low, smollm2, torch.float32, context=10 ** 6))


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
    for row in rows:                                    # every repeat kept, for busy.busy_reason
        assert len(row["timing"]["samples"]) == 1 and row["timing"]["median"] == row["seconds"]
    lin = roofline.sweep_linear(16, 8, [1, 4], device="cpu", repeats=2)
    assert lin[1]["flops"] == 2 * 16 * 8 * 4 and len(lin[1]["timing"]["samples"]) == 2


def _measured(batch, seconds, dtype="float32", size=4, flops=None, nbytes=None):
    cost = roofline.decode_step_cost(TINY, batch, 0, size)
    row = roofline._row(batch, Timing([seconds] * 3), cost, dtype)
    if flops is not None:
        row.update(flops=flops, bytes=nbytes, intensity=flops / nbytes)
    return row


def test_roofline_seconds_is_the_slower_of_the_two_limits(fake_profile):
    # 10 GB/s and 100 GFLOP/s: 1 GB and 1 GFLOP take 0.1 s and 0.01 s
    assert roofline.roofline_seconds(_measured(1, 1.0, flops=1e9, nbytes=1e9), fake_profile) == pytest.approx(0.1)
    assert roofline.roofline_seconds(_measured(1, 1.0, flops=50e9, nbytes=1e9), fake_profile) == pytest.approx(0.5)
    row = _measured(4, 0.02)
    assert roofline.roof_fraction(row, fake_profile) == pytest.approx(
        row["flops_per_s"] / fake_profile.attainable(row["intensity"], "float32"))
    with pytest.raises(LabError, match="bfloat16 was not measured"):
        roofline.roofline_seconds(_measured(1, 1.0, dtype="bfloat16"), fake_profile)
    with pytest.raises(LabError, match="sweep_decode"):
        roofline.roofline_seconds({"seconds": 1.0}, fake_profile)


def test_step_bounds(fake_profile):
    rows = [_measured(1, 0.15, flops=1e9, nbytes=1e9),     # roofline 0.1 s, below the ridge
            _measured(2, 0.50, flops=1e9, nbytes=1e9),     # 5x the roofline time
            _measured(64, 0.03, flops=2e9, nbytes=1e8)]    # roofline 0.02 s, past the ridge
    assert roofline.step_bounds(rows, fake_profile) == ["memory-bound", "overhead-bound", "compute-bound"]
    assert roofline.step_bounds(rows, fake_profile, slack=6) == ["memory-bound", "memory-bound", "compute-bound"]
    assert roofline.step_bounds(rows, fake_profile, slack=1) == ["overhead-bound"] * 3
    with pytest.raises(LabError, match="slack"):
        roofline.step_bounds(rows, fake_profile, slack=0.5)


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


def test_roofline_points_carry_their_batch(fake_profile):
    rows = [_measured(b, 0.01 * b) for b in (1, 4, 16)]
    fig = roofline_figure(fake_profile, sweep_points(rows, "decode"))
    trace = [t for t in fig.data if t.name == "decode"][0]
    assert list(trace.text) == ["B=1", "B=4", "B=16"]                 # written beside each marker
    assert "batch 16" in trace.customdata[2] and "%{customdata}" in trace.hovertemplate


def test_matvec_matmul_diagram():
    fig = matvec_matmul_figure(batch=4, in_features=6, out_features=5, bytes_per_value=4)
    # one cell per weight, input and output value, in each panel
    assert len(fig.layout.shapes) == (6 * 5 + 6 + 5) + (6 * 5 + 4 * 6 + 4 * 5)
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "used 1 time<br>2 FLOP / 4 bytes = <b>0.5 FLOP/byte" in texts
    assert "used 4 times<br>8 FLOP / 4 bytes = <b>2 FLOP/byte" in texts
    assert [t.hovertext[0] for t in fig.data] == ["W[0, 0]: read once, used 1 time", "W[0, 0]: read once, used 4 times"]
    assert "1.0 FLOP/byte" not in texts and "0.25" not in texts            # 2 FLOPs per multiply-add
    with pytest.raises(LabError, match="2 or more"):
        matvec_matmul_figure(batch=1)


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


def test_roofline_claims():
    # nearly flat up to batch 16, then time grows with the batch, near the roofline of a slow machine
    # (tiny-llama's weights take 9 ms at 40 MB/s): the claims hold (more cases: test_roofline_claims.py)
    slow = HardwareProfile(device="cpu", name="slow CPU", bandwidth=40e6, flops={"float32": 400e6})
    seconds = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.013, 16: 0.014, 32: 0.025}
    rows = [_measured(batch, s) for batch, s in seconds.items()]
    checks = roofline_claims(rows, slow)
    assert [c["verdict"] for c in checks] == ["holds", "holds", "holds"]
    table = records_table(checks)                             # the one table format, labsupport.lab.tables
    assert table.count("\n") == 4 and "| claim |" in table
    assert not hasattr(roofline, "markdown_table")            # one home: no second table function
