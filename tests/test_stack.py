"""Notebook 07's stack: every stage serves the same workload; fp32 stages give the
reference tokens exactly; gains and the claims table are computed from the timings."""

import pytest
import torch

from labsupport.claims import stack_claims
from labsupport.errors import LabError
from labsupport.plots.stack import cumulative_figure
from labsupport.lab.serving_workload import make_workload
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.lab.stack import HF_PEER, INT4_BATCH_1, Stage, best_under_budget, build_stages, run_stack


@pytest.fixture(scope="module")
def requests_():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 9, 4, 11, 7)]
    return make_workload(prompts, median_new_tokens=6, max_new_tokens=12, min_new_tokens=3, seed=2)


def test_every_stage_serves_every_request(tiny_llama, requests_):
    stages = build_stages(tiny_llama, requests_, slots=2)
    names = [s.name for s in stages]
    assert names[:3] == ["naive loop", "+ KV cache", "+ static batching"]
    assert names[-3:] == [INT4_BATCH_1, "+ speculative decoding", "+ continuous batching"]
    base = {s.name: s.builds_on for s in stages}
    assert base["+ speculative decoding"] == INT4_BATCH_1 and base[INT4_BATCH_1] == "+ KV cache"   # batch 1 vs batch 1
    assert {s.name: s.cached_sequences for s in stages if s.cached_sequences != 2} == {
        "naive loop": 0, "+ KV cache": 1, INT4_BATCH_1: 1, "+ speculative decoding": 1}
    reference = stages[1].run()
    for stage in stages:
        out = stage.run()
        assert [len(out[r.request_id]) for r in requests_] == [r.max_new_tokens for r in requests_], stage.name
        if stage.precision == "fp32":
            assert out == reference, stage.name            # fp32 stages: exactly the cached tokens


def test_run_stack_rows_figure_and_claims(tiny_llama, requests_):
    # a stand-in for Hugging Face generate() (`bench.peers.huggingface.hf_stack_stage`): timed, never on the ladder
    peer = Stage(HF_PEER, "a stand-in peer", lambda: {r.request_id: [0] * r.max_new_tokens for r in requests_})
    result = run_stack(tiny_llama, requests_, slots=2, peers=[peer], agreement_tokens=list(range(40)))
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
    spec = rows["+ speculative decoding"]["speculation"]          # what its drafts did: notebook 07's cost model
    assert spec["k"] == 4 and 0 <= spec["alpha"] <= 1 and spec["tokens_per_pass"] >= 1
    assert all(r["speculation"] is None for name, r in rows.items() if name != "+ speculative decoding")
    fig = cumulative_figure(result)
    assert len(fig.data) == 2 and list(fig.data[0].y) == list(rows) and fig.data[0].orientation == "h"
    table = stack_claims(result, tiny_llama)
    assert len(table) == 9 and all(r["measured here"] and r["verdict"] for r in table)


def test_rows_count_memory_and_teacher_forced_agreement(tiny_llama, requests_):
    peer = Stage(HF_PEER, "a stand-in peer", lambda: {r.request_id: [0] * r.max_new_tokens for r in requests_})
    result = run_stack(tiny_llama, requests_, slots=2, peers=[peer], agreement_tokens=list(range(40)))
    rows = {r["stage"]: r for r in result["stages"]}
    longest = max(r.max_length for r in requests_)
    assert rows["naive loop"]["kv_cache_bytes"] == 0
    assert rows["+ KV cache"]["kv_cache_bytes"] == kv_cache_bytes(tiny_llama.config, longest, 1)
    assert rows["+ static batching"]["kv_cache_bytes"] == 2 * rows["+ KV cache"]["kv_cache_bytes"]
    assert rows["+ int4 weights"]["weight_bytes"] < rows["+ KV cache"]["weight_bytes"] / 2
    assert rows[HF_PEER]["weight_bytes"] is None and rows[HF_PEER]["top1_agreement"] is None
    assert rows["+ KV cache"]["top1_agreement"] == 1.0                              # the fp32 model itself
    assert 0 <= rows["+ int4 weights"]["top1_agreement"] <= 1
    assert rows[INT4_BATCH_1]["top1_agreement"] == rows["+ int4 weights"]["top1_agreement"]   # the same model
    assert all(set(r["timing"]) >= {"median", "spread"} for r in result["stages"])
    assert "load" in result
    # without evaluation tokens, no agreement is claimed
    assert all(r["top1_agreement"] is None for r in run_stack(tiny_llama, requests_[:2], slots=2)["stages"])


def test_best_under_budget_picks_the_fastest_stage_that_fits():
    rows = [{"stage": "big", "tokens_per_s": 50.0, "weight_bytes": 900, "kv_cache_bytes": 100},
            {"stage": "small", "tokens_per_s": 20.0, "weight_bytes": 200, "kv_cache_bytes": 50},
            {"stage": "smaller", "tokens_per_s": 10.0, "weight_bytes": 100, "kv_cache_bytes": 10},
            {"stage": HF_PEER, "tokens_per_s": 99.0, "weight_bytes": None, "kv_cache_bytes": None}]
    assert best_under_budget(rows, 1000) == "big"                    # exactly the budget fits
    assert best_under_budget(rows, 999) == "small"
    assert best_under_budget(rows, 110) == "smaller"
    assert best_under_budget(rows, 109) is None


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


def test_stack_explorer_measures_quality_teacher_forced(tiny_llama, requests_):
    from labsupport.explorers.stack import stack_explorer
    from labsupport.lab.quality import top1_agreement
    from labsupport.lab.variants import ModelVariants
    variants = ModelVariants(tiny_llama)
    explorer = stack_explorer(tiny_llama, requests_[:2], slots=2, variants=variants,
                              agreement_tokens=list(range(30)), use_widget=False)
    figure = explorer.figures[0].figure                                   # the opening setting: int4 weights
    assert figure.layout.annotations[1].text == "agreement with fp32"
    want = top1_agreement(tiny_llama, variants.get(explorer.controls["precision"].value, "int4"), list(range(30)))
    assert figure.data[1].x[0] == pytest.approx(100 * want)


def test_every_stage_counts_its_weight_passes_and_bandwidth_fraction(tiny_llama, requests_):
    """One request at a time, a token costs one pass (the naive loop re-reads the whole
    sequence, the cache one token: both one pass per token); a padded batch of 2 costs one
    pass per step of its longest member; the fraction follows from passes, bytes and time."""
    result = run_stack(tiny_llama, requests_, slots=2, bandwidth=1e9)
    rows = {r["stage"]: r for r in result["stages"]}
    lengths = [r.max_new_tokens for r in requests_]
    assert rows["naive loop"]["weight_passes"] == sum(lengths)
    assert rows["+ KV cache"]["weight_passes"] == sum(lengths)
    batches = [lengths[i:i + 2] for i in range(0, len(lengths), 2)]
    assert rows["+ static batching"]["weight_passes"] == sum(max(b) for b in batches)
    assert rows["+ speculative decoding"]["weight_passes"] <= sum(lengths)
    for row in result["stages"]:
        assert row["bandwidth_fraction"] == pytest.approx(
            row["weight_bytes"] * row["weight_passes"] / row["seconds"] / 1e9)
    assert all(r["bandwidth_fraction"] is None for r in run_stack(tiny_llama, requests_[:2], slots=2)["stages"])


def test_removed_work_names_fewer_bytes_and_fewer_passes(tiny_llama, requests_):
    from labsupport.lab.stack import removed_work
    result = run_stack(tiny_llama, requests_, slots=2, bandwidth=1e9)
    removed = {r["stage"]: r for r in removed_work(result)}
    assert removed["+ KV cache"]["passes_per_token"] == 1.0 and removed["+ KV cache"]["bytes_per_pass"] == 1.0
    assert removed["+ static batching"]["passes_per_token"] < 1.0          # one pass serves two rows
    assert removed["+ int4 weights"]["bytes_per_pass"] < 0.5                # fewer bytes per weight
    assert "naive loop" not in removed and HF_PEER not in removed
