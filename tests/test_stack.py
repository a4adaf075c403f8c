"""Notebook 07's stack: every stage serves the same workload; fp32 stages give the
reference tokens exactly; gains and the claims table are computed from the timings."""

import pytest
import torch

from labsupport.claims import stack_claims
from labsupport.errors import LabError
from labsupport.plots.stack import cumulative_figure
from labsupport.serving import make_workload
from labsupport.stack import HF_PEER, Stage, build_stages, run_stack


@pytest.fixture(scope="module")
def requests_():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 9, 4, 11, 7)]
    return make_workload(prompts, median_new_tokens=6, max_new_tokens=12, min_new_tokens=3, seed=2)


def test_every_stage_serves_every_request(tiny_llama, requests_):
    stages = build_stages(tiny_llama, requests_, slots=2)
    names = [s.name for s in stages]
    assert names[:3] == ["naive loop", "+ KV cache", "+ static batching"]
    assert names[-2:] == ["+ speculative decoding", "+ continuous batching"]
    reference = stages[1].run()
    for stage in stages:
        out = stage.run()
        assert [len(out[r.request_id]) for r in requests_] == [r.max_new_tokens for r in requests_], stage.name
        if stage.precision == "fp32":
            assert out == reference, stage.name            # fp32 stages: exactly the cached tokens


def test_run_stack_rows_figure_and_claims(tiny_llama, requests_):
    # a stand-in for Hugging Face generate() (`bench.peers.hf_stack_stage`): timed, never on the ladder
    peer = Stage(HF_PEER, "a stand-in peer", lambda: {r.request_id: [0] * r.max_new_tokens for r in requests_})
    result = run_stack(tiny_llama, requests_, slots=2, peers=[peer])
    rows = {r["stage"]: r for r in result["stages"]}
    assert list(rows)[-1] == HF_PEER and not rows[HF_PEER]["kept"] and result["best"] != HF_PEER
    assert ("stack_vs_hf" in result) == (result["best"] is not None)
    assert rows["naive loop"]["cumulative"] == 1.0 and rows["naive loop"]["gain"] is None
    for row in result["stages"][1:]:
        if row["builds_on"] is None:
            continue
        base = rows[row["builds_on"]]
        assert row["gain"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"])
        assert row["kept"] == (row["gain"] > 1)
    assert rows["+ static batching"]["same_tokens_as_fp32"] == 1.0
    fig = cumulative_figure(result)
    assert len(fig.data) == 2 and list(fig.data[0].x) == list(rows)
    table = stack_claims(result, tiny_llama)
    assert len(table) == 8 and all(r["measured here"] for r in table)


def test_run_stack_refuses_an_empty_workload(tiny_llama):
    with pytest.raises(LabError, match="at least one request"):
        run_stack(tiny_llama, [])


def test_stack_explorer_runs_a_setting_and_explains_impossible_ones(tiny_llama, requests_):
    from labsupport.explorers.stack import stack_explorer
    explorer = stack_explorer(tiny_llama, requests_[:3], slots=2, use_widget=False)
    first = explorer.figures[0].figure
    assert len(first.data[0].y) == 1
    explorer.controls["batching"].value = "static"
    explorer.controls["weights"].value = "float"
    explorer.refresh()
    assert len(explorer.figures[0].figure.data[0].y) == 2                 # a second bar appeared
    explorer.controls["speculative"].value = True                         # with batching: impossible
    explorer.refresh()
    assert "one request at a time" in explorer.status.value
    assert len(explorer.figures[0].figure.data[0].y) == 2
