"""Notebook 06's figures and explorer: the figures draw what a run did, the explorer is live
(its checkers: tests/test_checkers.py)."""

import pytest
import torch

from labsupport.engine.serving import Engine
from labsupport.lab.serving_workload import make_workload
from labsupport.lab.serving_metrics import summarize


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
    assert summarize(runs["preempted"])["preemptions"] > 0
    fig = slot_timeline_figure({"tight cache": runs["preempted"]}, clock="steps")
    assert any(t.name == "stay cut by preemption" for t in fig.data)


def test_block_table_figure_draws_one_arrow_per_table_entry():
    from labsupport.plots.serving import block_table_figure
    from labsupport.engine.serving import BlockManager
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

def test_explorer_redraws_when_a_control_changes_and_opens_with_the_notebooks_runs(tiny_llama):
    from labsupport.explorers.serving import serving_explorer, setting_label, short_label
    from labsupport.lab.load_curve import at_rate
    torch.manual_seed(0)
    requests = make_workload([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]], count=5,
                             median_new_tokens=3, max_new_tokens=6)
    opened = Engine(tiny_llama, max_slots=2, block_size=4, token_budget=8).run(at_rate(requests, 40.0))
    explorer = serving_explorer(tiny_llama, requests, capacity=80.0, max_slots=2, block_size=4, budgets=(4,),
                                opening={("50% of capacity", "continuous", 8, False): opened}, use_widget=False,
                                loads={"all at once": None, "50% of capacity": 0.5, "200% of capacity": 2.0})
    values = {name: c.value for name, c in explorer.controls.items()}
    assert list(explorer.controls["load"].options) == ["all at once", "50% of capacity", "200% of capacity"]
    assert values == {"load": "50% of capacity", "policy": "continuous", "budget": "8", "prefix": "off"}
    assert list(explorer.controls["budget"].options) == ["off", "4", "8"]
    before = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert len(before) == 2 and explorer.status.value == ""
    assert list(before[1][0]["y"]) == [short_label("50% of capacity", "continuous", 8, False)]   # not served again
    assert list(before[1][0]["customdata"]) == [setting_label("50% of capacity", "continuous", 8, False)]  # hover
    explorer.controls["prefix"].value = "on"
    after = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == "" and after != before and len(after[1][0]["y"]) == 2
    cached = next(t for t in after[0] if t["name"] == "prompt tokens from the prefix cache")
    assert sum(cached["y"]) > 0                                          # the shared 8-token prefix: two blocks
    explorer.controls["budget"].value = "off"
    explorer.controls["load"].value = "all at once"
    explorer.controls["policy"].value = "static"
    again = explorer.figures[1].figure.to_plotly_json()["data"]
    assert len(again[0]["x"]) == 5 and any(t["name"] == "inter-token latency p99" for t in again)
    explorer.controls["policy"].value = "continuous"                   # cached: shown at once
    assert len(explorer.figures[1].figure.to_plotly_json()["data"][0]["x"]) == 5


# --- the engine's second half: prefill chunks, the prefix cache, the load curve, the decode step ---

@pytest.fixture(scope="module")
def chunked_cached(tiny_llama):
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14]]
    requests = make_workload(prompts, count=5, rate=0.5, median_new_tokens=4, max_new_tokens=8, seed=1)
    return Engine(tiny_llama, max_slots=2, block_size=4, token_budget=4, prefix_caching=True).run(
        requests, clock="steps")


def test_phase_timeline_shows_prefill_chunks_decodes_and_cached_tokens(chunked_cached):
    from labsupport.plots.serving import phase_timeline_figure, prefill_spans
    run = chunked_cached
    fig = phase_timeline_figure(run, clock="steps")
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"decoding / decode tokens", "prefilling / prompt tokens computed", "decode tokens",
                            "prompt tokens computed", "prompt tokens from the prefix cache"}
    assert by_name["decoding / decode tokens"].marker.color != by_name["prefilling / prompt tokens computed"].marker.color
    shown = [t.name for t in fig.data if t.showlegend is not False]      # one legend entry per colour
    assert shown == ["decoding / decode tokens", "prefilling / prompt tokens computed",
                     "prompt tokens from the prefix cache"]
    assert list(by_name["prompt tokens computed"].y) == [r.prefill_tokens for r in run.steps]
    assert sum(by_name["prompt tokens from the prefix cache"].y) == summarize(run)["prefix_cached_tokens"] > 0
    assert by_name["prompt tokens from the prefix cache"].marker.pattern.shape == "/"
    # stacked: the computed prompt tokens sit on the decodes, the cached ones on both
    assert list(by_name["prompt tokens computed"].base) == [r.decode_rows for r in run.steps]
    assert list(by_name["prompt tokens from the prefix cache"].base) == [
        r.decode_rows + r.prefill_tokens for r in run.steps]
    assert any(s.line.dash == "dash" for s in fig.layout.shapes)               # the token budget
    spans = prefill_spans(run)
    # a prompt of 9 or 13 tokens under a budget of 4 takes several steps to prefill
    assert len(spans) >= 5 and max(s["end"] - s["start"] for s in spans) >= 2
    assert all(s["start"] <= s["end"] for s in spans)


def test_load_curve_figure_draws_one_line_per_configuration():
    from labsupport.plots.serving import load_curve_figure
    rows = [{"configuration": c, "rate": r, "throughput": 10 * r, "ttft_p99": r, "itl_p99": 0.01 * r}
            for c in ("continuous", "chunked prefill") for r in (2.0, 1.0)]
    fig = load_curve_figure(rows)
    assert [t.name for t in fig.data] == ["continuous", "continuous", "chunked prefill", "chunked prefill"]
    assert list(fig.data[0].x) == [10.0, 20.0] and list(fig.data[1].y) == [10.0, 20.0]   # ms, in order of rate
    assert [t.showlegend for t in fig.data] == [True, False, True, False]


def test_decode_cost_figure_shows_the_shares_and_both_paths():
    from labsupport.plots.serving import decode_cost_figure
    costs = {"table_build_share": 0.05, "gather_share": 0.25, "rest_share": 0.7, "step_s": 0.02,
             "pool_step_s": 0.015, "batch_size": 8, "context": 128}
    fig = decode_cost_figure(costs)
    shares = [t for t in fig.data if t.orientation == "h"]
    assert [t.x[0] for t in shares] == [0.05, 0.25, 0.7] and [t.text[0] for t in shares] == ["5%", "25%", "70%"]
    assert list(fig.data[-1].y) == pytest.approx([20.0, 15.0]) and "8 rows at 128 positions" in fig.layout.title.text


def test_settings_figure_has_a_row_per_setting_named_in_one_line():
    from labsupport.explorers.serving import setting_label, short_label
    from labsupport.plots.serving_settings import ROW_PX, settings_figure
    keys = [("90% of capacity", "continuous", 32, True), ("all at once", "static", None, False)]
    rows = [{"label": short_label(*k), "name": setting_label(*k), "policy": k[1], "throughput": 10.0 + i,
             "ttft_p50": 0.1, "latency_p50": 0.2, "latency_p99": 0.4, "itl_p99": 0.05} for i, k in enumerate(keys)]
    fig = settings_figure(rows, current=rows[0]["label"])
    assert short_label(*keys[0]) == "continuous · budget 32 · prefix cache · 90%"
    assert all(t.orientation == "h" for t in fig.data)                               # names on the rows
    assert list(fig.data[0].y) == [r["label"] for r in rows]
    assert list(fig.data[0].customdata) == [setting_label(*k) for k in keys]          # the full name in the hover
    assert fig.layout.legend.yref == "container"                                     # under the plots (layout.py)
    assert [t.name for t in fig.data[1:]] == ["time to first token p50", "latency p50", "latency p99",
                                              "inter-token latency p99"]
    assert list(fig.data[0].marker.opacity) == [1.0, 0.4]
    taller = settings_figure(rows * 6, current=rows[0]["label"])
    assert taller.layout.height - fig.layout.height == 10 * ROW_PX                   # grows with the settings


def test_notebook_06s_explorer_offers_the_arrival_rate_and_the_policy_only(tiny_llama):
    """chunking=False (notebook 06): no token budget or prefix cache control, and every setting is
    served without either; 06b's explorer (the test above) adds both."""
    from labsupport.explorers.serving import serving_explorer, short_label
    requests = make_workload([[1, 2, 3, 4, 5], [6, 7, 8]], count=4, median_new_tokens=3, max_new_tokens=5, seed=3)
    opened = Engine(tiny_llama, max_slots=2, block_size=4, policy="static").run(requests)
    explorer = serving_explorer(tiny_llama, requests, capacity=50.0, max_slots=2, block_size=4, chunking=False,
                                opening={("all at once", "static", None, False): opened}, use_widget=False,
                                loads={"all at once": None, "90% of capacity": 0.9})
    assert set(explorer.controls) == {"load", "policy"} and "token budget" not in explorer.title
    assert explorer.controls["policy"].value == "static"
    explorer.controls["load"].value = "90% of capacity"
    labels = list(explorer.figures[1].figure.to_plotly_json()["data"][0]["y"])
    assert labels == [short_label("all at once", "static", None, False),
                      short_label("90% of capacity", "static", None, False)]
