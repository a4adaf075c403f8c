"""Notebook 06's side-by-side rounds, where the prefix cache's tokens came from, and the
"where it loses here" ledger (labsupport.lab.serving_metrics, labsupport.claims.serving)."""

import pytest
import torch

from labsupport.engine.serving import Engine
from labsupport.lab.measure import Timing, time_side_by_side
from labsupport.lab.serving_metrics import prefix_cache_sources, side_by_side_rounds, summarize
from labsupport.lab.serving_workload import make_workload


def test_rounds_say_the_rotated_order_time_side_by_side_ran():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("static", "continuous", "hf")}
    timings = time_side_by_side(fns, "cpu", warmup=1, repeats=3)
    rounds = side_by_side_rounds(timings)
    assert rounds["rounds"] == 3 and calls[:3] == ["static", "continuous", "hf"]        # the warm-up, in order
    assert sum(rounds["orders"], []) == calls[3:]                                       # then the rounds, as run
    assert rounds["orders"][1] == ["continuous", "hf", "static"]
    assert set(rounds["spread"]) == set(fns) and all(len(s) == 3 for s in rounds["seconds"].values())
    assert side_by_side_rounds({"a": Timing([1.0, 2.0, 3.0])})["spread"]["a"] == pytest.approx(1.0)


SYSTEM = list(range(1, 10))                                      # 9 tokens every prompt begins with
PROMPTS = [SYSTEM + [20, 21, 22, 23, 24, 25, 26], SYSTEM + [30, 31, 32], SYSTEM + [20, 21, 22, 23, 40, 41, 42, 43]]


@pytest.mark.parametrize("slots", [1, 3])
def test_prefix_cache_sources_split_the_runs_own_count(tiny_llama, slots):
    torch.manual_seed(0)
    requests = make_workload(PROMPTS, count=9, median_new_tokens=3, max_new_tokens=6)   # each prompt three times
    run = Engine(tiny_llama, max_slots=slots, block_size=4, prefix_caching=True).run(requests, clock="steps")
    sources = prefix_cache_sources(run)
    assert sources["matches_run"] and sources["total"] == summarize(run)["prefix_cached_tokens"] > 0
    assert sources["common_prefix"] == 9 and sources["repeated_requests"] == 6 and sources["requests"] == 9
    assert sources["repeated_prompt"] > 0                     # a repeated prompt finds more than the shared 8
    assert sources["shared_prefix"] % 4 == 0 and sources["shared_prefix"] <= 8 * 9


def test_prefix_cache_sources_without_repeats_credit_only_the_shared_prefix(tiny_llama):
    requests = make_workload(PROMPTS, count=3, median_new_tokens=3, max_new_tokens=4)
    run = Engine(tiny_llama, max_slots=1, block_size=4, prefix_caching=True).run(requests, clock="steps")
    sources = prefix_cache_sources(run)
    assert sources["repeated_prompt"] == 0 and sources["repeated_requests"] == 0
    assert sources["shared_prefix"] == 2 * 8                  # requests 1 and 2 reuse the two full shared blocks
    assert sources["other_prefix"] == 4                       # request 2 begins like request 0 for one more block


def _metrics(slot_use, steps, ttft_p50, computed):
    return {"slot_utilization": slot_use, "steps": steps, "ttft_p50": ttft_p50, "prefill_tokens_computed": computed}


def test_losses_ledger_names_what_did_not_pay_and_why():
    from labsupport.claims.serving import serving_losses
    speed = {"static": 10.0, "continuous": 10.2, "hf": 12.0}
    metrics = {"static": _metrics(0.5, 40, 1.0, 100), "continuous": _metrics(0.8, 30, 0.8, 100)}
    chunked = {"without": {"itl_p99": 0.2, "throughput": 10.0}, "with": {"itl_p99": 0.18, "throughput": 8.0}}
    lines = serving_losses(speed, metrics, {"ratio": 1.3}, {"without": metrics["continuous"],
                                                              "with": _metrics(0.8, 30, 0.7, 40)}, chunked,
                           costs={"gather_share": 0.2, "table_build_share": 0.02},
                           sources={"total": 60, "repeated_prompt": 30, "repeated_requests": 4, "common_prefix": 20},
                           busy={"speed": "the load average was 3.0 per core"})
    text = " ".join(lines)
    assert "1.02x static" in text and "timed while the load average was 3.0 per core" in text
    assert "0.85x Hugging Face" in text and "kept 80% of the throughput" in text and "only 1.11x" in text
    assert "only 1.14x sooner" in text and "50% of the prompt tokens prefix caching saved" in text
    assert "20% of its time gathering" in text
    quiet = serving_losses({"static": 10.0, "continuous": 20.0, "hf": 10.0}, metrics, {"ratio": 2.0},
                           {"without": metrics["continuous"], "with": _metrics(0.8, 30, 0.2, 40)},
                           {"without": {"itl_p99": 0.3, "throughput": 10.0}, "with": {"itl_p99": 0.1, "throughput": 9.5}},
                           costs={"gather_share": 0.02, "table_build_share": 0.01})
    assert quiet == [quiet[0]] and quiet[0].startswith("Nothing measured here lost")


def test_each_notebook_has_its_half_of_the_ledger():
    """06 reads `batching_losses`, 06b `engine_losses`; together they are the bench's `serving_losses`."""
    from labsupport.claims.serving import batching_losses, engine_losses, serving_losses
    speed = {"static": 10.0, "continuous": 10.2, "hf": 12.0}
    metrics = {"static": _metrics(0.5, 40, 1.0, 100), "continuous": _metrics(0.8, 30, 0.8, 100)}
    prefix = {"without": metrics["continuous"], "with": _metrics(0.8, 30, 0.7, 40)}
    chunked = {"without": {"itl_p99": 0.2, "throughput": 10.0}, "with": {"itl_p99": 0.18, "throughput": 8.0}}
    costs = {"gather_share": 0.2, "table_build_share": 0.02}
    first = batching_losses(speed, metrics, costs=costs, busy={"costs": "the load average was 3.0 per core"})
    second = engine_losses({"ratio": 1.3}, prefix, chunked, busy={"prefix": "a round spread 40%"})
    assert len(first) == 3 and "static" in first[0] and "gathering" in first[2]
    assert "timed while the load average was 3.0 per core" in first[2] and "timed while" not in first[0]
    assert not any("Chunked" in line or "Prefix" in line for line in first)
    assert len(second) == 3 and all("Chunked" in line or "Prefix" in line for line in second)
    assert "timed while a round spread 40%" in second[2]
    assert serving_losses(speed, metrics, {"ratio": 1.3}, prefix, chunked, costs=costs) == \
        batching_losses(speed, metrics, costs=costs) + engine_losses({"ratio": 1.3}, prefix, chunked)
    fast = {"static": 10.0, "continuous": 20.0, "hf": 10.0}
    assert batching_losses(fast, metrics, costs={"gather_share": 0.02, "table_build_share": 0.01}) == []
    assert batching_losses(fast, metrics) == []                                  # the decode costs not run
