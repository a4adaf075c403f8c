"""Notebook 06's figures and explorer: the figures draw what a run did, the explorer is live
(its checkers: tests/test_checkers.py)."""

import pytest
import torch

from labsupport.serving import Engine, make_workload


# --- figures ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tiny_llama):
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    requests = make_workload(prompts, count=8, median_new_tokens=6, max_new_tokens=20, seed=2)
    out = {policy: Engine(tiny_llama, max_slots=3, policy=policy, block_size=4).run(requests, clock="steps")
           for policy in ("static", "continuous")}
    out["preempted"] = Engine(tiny_llama, max_slots=3, block_size=4, cache_tokens=40).run(requests, clock="steps")
    return out


def test_slot_timeline_draws_every_stay_and_marks_preemption(runs):
    from labsupport.plots.serving import slot_timeline_figure
    fig = slot_timeline_figure({"static": runs["static"], "continuous": runs["continuous"]}, clock="steps")
    bars = [t for t in fig.data if t.name == "request in a slot"]
    assert len(bars) == 2 and all(len(t.x) == 8 for t in bars)          # 8 requests in each subplot
    assert fig.layout.xaxis2.title.text == "engine steps"
    static_end = max(b + w for b, w in zip(bars[0].base, bars[0].x))
    continuous_end = max(b + w for b, w in zip(bars[1].base, bars[1].x))
    assert continuous_end < static_end
    assert runs["preempted"].metrics()["preemptions"] > 0
    fig = slot_timeline_figure({"tight cache": runs["preempted"]}, clock="steps")
    assert any(t.name == "stay cut by preemption" for t in fig.data)


def test_block_table_figure_draws_one_arrow_per_table_entry():
    from labsupport.plots.serving import block_table_figure
    from labsupport.serving import BlockManager
    blocks = BlockManager(num_blocks=12, block_size=4)
    blocks.grow(0, 6), blocks.grow(1, 3), blocks.grow(0, 9)              # tables {0: [0, 1, 3], 1: [2]}
    fig = block_table_figure(blocks.tables, {0: 9, 1: 3}, num_blocks=12, block_size=4)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert sorted(a.x for a in arrows) == [0, 1, 2, 3]                   # each points at its physical block
    assert [a.ax for a in arrows] == [0, 1, 2, 3.7]                      # from logical blocks, side by side
    boxes = [s for s in fig.layout.shapes if s.fillcolor == "white"]
    assert len(boxes) == 4 + 12                                          # logical blocks, then the pool
    hover = list(fig.data[0].hovertext)
    assert "sequence 0, logical block 2 (positions 8-8) -> physical block 3" in hover
    assert "physical block 3: sequence 0's logical block 2, 1 of 4 positions filled" in hover
    assert "physical block 11: free" in hover
    filled = [s for s in fig.layout.shapes if s.fillcolor != "white"]
    assert len(filled) == 2 * 4                                          # the owned blocks, logical and physical
    assert max(s.x1 - s.x0 for s in filled) == pytest.approx(0.8) and min(s.x1 - s.x0 for s in filled) == pytest.approx(0.2)


def test_utilization_and_blocks_figures(runs):
    from labsupport.plots.serving import blocks_figure, utilization_figure
    fig = utilization_figure({"static": runs["static"], "continuous": runs["continuous"]}, clock="steps")
    assert [t.name for t in fig.data] == ["static", "continuous"] and max(fig.data[1].y) <= 3
    fig = blocks_figure({"continuous": runs["continuous"]}, reserved_blocks=30, clock="steps")
    assert len(fig.data[0].y) == len(runs["continuous"].steps) and fig.layout.yaxis.title.text == "blocks in use"


# --- the explorer ------------------------------------------------------------------

def test_explorer_redraws_when_a_control_changes(tiny_llama):
    from labsupport.explorers.serving import serving_explorer
    torch.manual_seed(0)
    explorer = serving_explorer(tiny_llama, [[1, 2, 3, 4], [5, 6, 7, 8, 9]], count=6, median_new_tokens=4,
                                max_new_tokens=10, max_slots=4, block_size=4, use_widget=False)
    before = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert len(before) == 2 and explorer.status.value == ""
    explorer.controls["slots"].value = 2
    after = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == "" and after != before
    assert len(after[1][0]["x"]) == 2                                  # two settings measured
    explorer.controls["policy"].value = "static"
    explorer.controls["rate"].value = "1 per 2 steps"
    again = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == "" and again != after and len(again[1][0]["x"]) == 4
    explorer.controls["policy"].value = "continuous"                   # cached: shown at once
    assert len(explorer.figures[1].figure.to_plotly_json()["data"][0]["x"]) == 5
