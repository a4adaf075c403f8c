"""Notebook 02 (batching): its helpers, figures and explorer, on a tiny random model
(its checkers: tests/test_checkers.py)."""

import pytest

import math

from labsupport.lab import batching_timing, batching
from labsupport.engine import padding
from labsupport.explorers.batching import batching_explorer
from labsupport.weights.fixtures import ByteTokenizer
from labsupport.plots.batching import left_padding_figure, padding_figure, peer_figure, scaling_figure


def test_helpers():
    assert batching.spread_lengths(4, 64, 0.0) == [64] * 4
    assert batching.spread_lengths(4, 64, 1.0) == [64, 43, 21, 1]
    assert batching.combined_waste([[3, 1], [2, 2]]) == pytest.approx(0.2)
    prompts = batching.prompts_of_lengths([1, 2, 3], [5, 2])
    assert prompts == [[1, 2, 3, 1, 2], [1, 2]]
    rows = [{"batch": b, "tokens_per_s": t} for b, t in [(1, 10), (2, 19), (4, 36), (8, 30)]]
    assert batching.scaling_stops_at(rows) == 8


def test_measure_batch(tiny_llama):
    row = batching_timing.measure_batch(tiny_llama, [[1, 2, 3], [4]], new_tokens=3, warmup=0)
    assert row["batch"] == 2 and row["tokens_per_s"] > 0 and row["ms_per_token"] > 0
    assert row["padding_waste"] == pytest.approx(1 / 3)


def test_scaling_figure_traces():
    rows = [{"batch": b, "tokens_per_s": 10 * b ** 0.8, "ms_per_token": 100 * b ** 0.2} for b in (1, 2, 4)]
    fig = scaling_figure(rows, highlight=rows[1])
    assert len(fig.data) == 2 + 2 + 2              # measured, ideal, current, in each panel
    ideal = [t for t in fig.data if t.name.startswith("ideal: batch 1 x")][0]
    assert list(ideal.y) == pytest.approx([10, 20, 40])
    assert fig.layout.xaxis.type == "log" and "tokens/s" in fig.layout.yaxis.title.text
    assert "ms" in fig.layout.yaxis2.title.text


def test_the_batch_axis_starts_at_batch_1():
    one = [{"batch": 1, "tokens_per_s": 10.0, "ms_per_token": 100.0}]
    fig = scaling_figure(one, highlight=one[0], axis_batches=[1, 2, 4, 8])
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert list(axis.tickvals) == [1, 2, 4, 8] and list(axis.ticktext) == ["1", "2", "4", "8"]
        low, high = axis.range                                          # log10 units
        assert -0.1 < low < 0 and high == pytest.approx(math.log10(8) + 0.08)
    assert scaling_figure(one).layout.xaxis.range[1] > math.log10(2)    # never a zero-width axis


def test_left_padding_figure_shows_tokens_mask_and_positions():
    fig = left_padding_figure(padding.left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0))
    tokens, mask, positions = fig.data
    assert [list(r) for r in tokens.z] == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]      # 1: real token, 0: padding
    assert [list(r) for r in tokens.text] == [["5", "6", "7"], ["0", "0", "8"], ["0", "9", "10"]]
    assert [list(r) for r in mask.text] == [["1", "1", "1"], ["0", "0", "1"], ["0", "1", "1"]]
    assert [list(r) for r in positions.text] == [["0", "1", "2"], ["(0)", "(0)", "0"], ["(0)", "0", "1"]]
    assert [a.text for a in fig.layout.annotations[:3]] == ["tokens", "attention mask", "position ids"]
    assert "[3, 1, 2] tokens" in fig.layout.title.text
    words = left_padding_figure(padding.left_pad([[5], [6, 7]], pad_id=0), token_text=[["<pad>", "hi"], ["a", "b"]])
    assert list(words.data[0].text[0]) == ["<pad>", "hi"]


def test_padding_figure_and_peer_figure():
    fig = padding_figure([[5, 1], [5, 1]], [[5, 5], [1, 1]])
    assert [t.name for t in fig.data] == ["padding", "prompt tokens"] * 2
    assert list(fig.data[0].x) == [0, 4, 0, 4] and list(fig.data[2].x) == [0, 0, 0, 0]
    assert "40%" in fig.layout.annotations[0].text and "0%" in fig.layout.annotations[1].text
    bars = peer_figure({"labsupport": 20.0, "huggingface": 10.0})
    assert list(bars.data[0].y) == [20.0, 10.0] and "tokens/s" in bars.layout.yaxis.title.text


@pytest.mark.parametrize("use_widget", [False, True])
def test_explorer_responds(tiny_llama, use_widget):
    explorer = batching_explorer(tiny_llama, ByteTokenizer(), batches=[1, 2, 4], spreads=(0.0, 1.0),
                                 longest=12, new_tokens=2, use_widget=use_widget)
    assert set(explorer.controls) == {"batch", "spread"}
    assert all(c.continuous_update is False for c in explorer.controls.values())

    def scaling_x():
        return [list(t.x) for t in explorer.figures[0].figure.data]

    before = scaling_x()
    explorer.controls["batch"].value = 4
    assert scaling_x() != before
    assert "0%" in explorer.figures[1].figure.layout.title.text
    explorer.controls["spread"].value = 1.0
    assert "0%" not in explorer.figures[1].figure.layout.title.text.split(":")[1][:4]
    assert len(explorer.figures[1].figure.data[0].x) == 4          # four rows in the padded picture
    explorer.controls["batch"].value = 1                               # cached: no new measurement
    assert explorer.status.value == ""


def test_explorer_opens_with_the_notebooks_sweep(tiny_llama, monkeypatch):
    from labsupport.explorers import batching as module

    sweep = [{"batch": b, "tokens_per_s": 10.0 * b, "ms_per_token": 50.0, "prefill_s": 0.1, "padding_waste": 0.0,
              "seconds": 1.0, "spread": 0.0} for b in (1, 2, 4, 8)]
    monkeypatch.setattr(module, "measure_batch", lambda *a, **k: pytest.fail("measured at opening"))
    explorer = module.batching_explorer(tiny_llama, ByteTokenizer(), batches=[1, 2, 4], spreads=(0.0, 1.0),
                                        longest=12, new_tokens=2, measured=sweep, use_widget=False)
    scaling = explorer.figures[0].figure
    assert list(scaling.data[0].x) == [1, 2, 4, 8] and scaling.data[0].name == "spread 0.00"
    assert scaling.layout.xaxis.tickvals[0] == 1 and scaling.layout.xaxis.range[0] < 0 < scaling.layout.xaxis.range[1]
