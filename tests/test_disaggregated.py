"""Disaggregated prefill and decode (notebook 10): a prefill rank hands each prompt's KV cache to a
decode rank; every request's tokens equal the request alone, and both designs are judged by goodput."""

from dataclasses import replace

import pytest

from labsupport.engine.generation import generate
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import Engine, Request
from labsupport.errors import LabError
from labsupport.lab.tensor_parallel_disaggregated import compare_with_colocated, goodput, serve_disaggregated
from labsupport.weights.fixtures import random_model


def workload(n=6):
    return [Request(list(range(1 + i, 20 + 3 * i)), max_new_tokens=4 + i % 3, arrival=0.03 * i, request_id=i)
            for i in range(n)]


def test_every_request_gets_the_tokens_it_gets_alone_and_every_cache_is_handed_over():
    model = random_model("tiny-llama")
    requests = workload()
    out = serve_disaggregated(model, requests, slots=2, block_size=4, timeout=120)
    config = model.config
    for request, row in zip(requests, out["requests"]):
        alone = generate(model, request.prompt, request.max_new_tokens, eos_token_ids=()).tokens[0].tolist()
        assert row["tokens"] == alone
        assert row["ttft"] > 0 and row["tpot"] > 0 and row["finished"] >= request.arrival + row["ttft"]
    assert [h["bytes"] for h in out["handovers"]] == [
        2 * config.num_layers * len(r.prompt) * config.num_kv_heads * config.head_dim * 4 for r in requests]


def test_the_comparison_serves_the_same_requests_both_ways():
    model = random_model("tiny-llama")
    out = compare_with_colocated(model, workload(4), slots=2, token_budget=8, ttft_slo=5.0, tpot_slo=5.0)
    assert out["same_tokens"] and out["handover"]["count"] == 4
    for name in ("disaggregated", "colocated"):
        assert out[name]["met"] == 1.0 and out[name]["goodput"] > 0 and len(out[name]["rows"]) == 4


def test_goodput_counts_requests_meeting_both_objectives_over_the_span():
    rows = [{"ttft": 0.5, "tpot": 0.1, "finished": 2.0}, {"ttft": 1.5, "tpot": 0.1, "finished": 3.0},
            {"ttft": 0.5, "tpot": 0.3, "finished": 4.0}]
    assert goodput(rows, 1.0, 0.2) == {"goodput": 0.25, "met": 1 / 3, "ttft_slo": 1.0, "tpot_slo": 0.2}


def test_bad_workloads_are_one_sentence():
    model = random_model("tiny-llama")
    with pytest.raises(LabError, match="at least one request"):
        serve_disaggregated(model, [])
    with pytest.raises(LabError, match="max_new_tokens of 2 or more"):
        serve_disaggregated(model, [Request([1, 2, 3], max_new_tokens=1)])


def test_the_claims_and_the_ledger_judge_the_comparison():
    from labsupport.claims.tensor_parallel import disaggregation_claims, tensor_parallel_losses
    row = {"ttft_slo": 1.0, "tpot_slo": 0.15}
    comparison = {"requests": 12, "same_tokens": True, "handover": {"bytes_per_request": 2 ** 21,
                                                                    "seconds_per_request": 0.0016},
                  "disaggregated": dict(row, goodput=0.74, tpot_p50=0.149),
                  "colocated": dict(row, goodput=2.44, tpot_p50=0.051)}
    claims = disaggregation_claims(comparison)
    assert claims[0]["verdict"] == "holds" and claims[1]["verdict"] == "not here: 0.30x the colocated engine's goodput"
    assert "2.0 MiB took 1.6 ms" in claims[1]["measured"]
    assert disaggregation_claims(comparison, busy="a busy machine")[1]["verdict"].startswith("the machine was busy")
    better = dict(comparison, disaggregated=dict(row, goodput=3.0, tpot_p50=0.05))
    assert disaggregation_claims(better)[1]["verdict"] == "holds"
    tp = {"prefill_tokens": 512, "degrees": {1: {"decode_tokens_per_s": 20.0, "prefill_s": 0.6},
                                             2: {"decode_tokens_per_s": 20.0, "prefill_s": 0.6,
                                                 "shares": [{"kv_heads": 1}, {"kv_heads": 1}]}}}
    lines = tensor_parallel_losses(tp, [], comparison)
    assert len(lines) == 1 and "0.74 requests/s of goodput against the colocated engine's 2.44" in lines[0]
    assert tensor_parallel_losses(tp, [], better) == ["Nothing measured here lost to its baseline."]


def test_each_request_passes_from_rank_0_to_rank_1_in_order_and_the_figure_draws_every_phase():
    from labsupport.plots.tensor_parallel import HANDOVER_PHASES, handover_figure
    model = random_model("tiny-llama")
    rows = serve_disaggregated(model, workload(4), slots=1, block_size=4, timeout=120)["requests"]
    for row in rows:
        # the prefill cannot start before the arrival, the cache cannot arrive before the first token...
        moments = [row["arrival"], row["prefill_from"], row["first_token"], row["received"], row["seated"],
                   row["finished"]]
        assert moments == sorted(moments), moments
    fig = handover_figure(rows)
    assert [bar.name for bar in fig.data] == [label for label, *_ in HANDOVER_PHASES]
    for bar in fig.data:
        assert len(bar.x) == 4 and min(bar.x) >= 0
    decode = fig.data[-1]
    assert list(decode.base) == [r["seated"] for r in rows]
    assert [b + x for b, x in zip(decode.base, decode.x)] == pytest.approx([r["finished"] for r in rows])


def test_a_receiver_that_fails_posts_its_error_for_the_decode_loop_instead_of_leaving_it_waiting(monkeypatch):
    import queue

    import torch

    from labsupport.lab import tensor_parallel_disaggregated

    def broken(*args, **kwargs):
        raise RuntimeError("Connection closed by peer")
    monkeypatch.setattr(torch.distributed, "recv", broken)
    arrived = queue.Queue()
    tensor_parallel_disaggregated._receive_handovers(random_model("tiny-llama").config, torch.float32, 0.0, arrived)
    error = arrived.get(timeout=1)
    assert isinstance(error, RuntimeError) and "closed by peer" in str(error)


# --- issue 50: sampled requests, end tokens, and bad arguments before any process starts -----

def alone(model, request):
    """The tokens the single-process engine gives `request` served alone."""
    return list(Engine(model, max_slots=1).run([request]).sequences[0].output)


def test_sampled_requests_and_end_tokens_get_what_the_engine_gives_each_alone():
    """Issue 50: every request was answered greedily (rank 0's argmax, rank 1's argmax) and ran past
    its end tokens."""
    model = random_model("tiny-llama")
    hot = SamplingConfig(temperature=1.5, top_p=0.95, seed=7)
    requests = [Request(list(range(3, 15)), max_new_tokens=8, sampling=hot, arrival=0.0, request_id="sampled"),
                Request(list(range(20, 29)), max_new_tokens=6, sampling=SamplingConfig(temperature=0.9, top_k=50,
                                                                                         seed=123),
                        arrival=0.02, request_id="top-k")]
    free = alone(model, requests[0])
    assert free != alone(model, replace(requests[0], sampling=SamplingConfig()))     # sampling changes the answer
    # end tokens: the third token of the free answer, and the first token of the greedy answer
    requests.append(replace(requests[0], eos_token_ids=[free[2]], request_id="ends-early", arrival=0.04))
    greedy = Request([9, 8, 7, 6, 5], max_new_tokens=5, arrival=0.06, request_id="greedy-first-token-ends")
    requests.append(replace(greedy, eos_token_ids=[alone(model, greedy)[0]]))
    out = serve_disaggregated(model, requests, slots=2, block_size=4, timeout=120)
    got = [row["tokens"] for row in out["requests"]]
    assert got == [alone(model, r) for r in requests]
    assert len(got[2]) == free.index(free[2]) + 1 and len(got[3]) == 1


class NoProcess(Exception):
    """Raised by a stand-in for whatever would start a process."""


def _refuse_to_start(*args, **kwargs):
    raise NoProcess("a process was about to start")


@pytest.mark.parametrize("change, words", [
    ({"slots": 0}, "slots"), ({"slots": True}, "slots"), ({"slots": 2.5}, "slots"),
    ({"block_size": 0}, "block_size"), ({"block_size": 10 ** 9}, "block_size"),
    ({"timeout": float("nan")}, "timeout"), ({"timeout": 0}, "timeout"), ({"timeout": -5}, "timeout"),
    ({"timeout": True}, "timeout"), ({"timeout": float("inf")}, "timeout"),
    ({"requests": [Request(list(range(250)), max_new_tokens=10)]}, "context holds 256"),
    ({"requests": [Request([1, 2, 99999], max_new_tokens=3)]}, "outside the vocabulary"),
    ({"requests": [Request([1, 2, -1], max_new_tokens=3)]}, "outside the vocabulary"),
    ({"requests": [Request([1, 2], max_new_tokens=3, on_token=print)]}, "on_token"),
    ({"requests": [Request([1, 2], max_new_tokens=3, logprobs=2)]}, "logprobs"),
    ({"requests": [[1, 2, 3]]}, "Request objects"), ({"requests": "hello"}, "list of Request"),
    ({"requests": Request([1, 2], max_new_tokens=3)}, "list of Request"),
])
def test_bad_arguments_are_one_sentence_before_any_process_starts(monkeypatch, change, words):
    """Issue 50: slots=0 spun for the whole timeout; a prompt past the context or outside the
    vocabulary came back as a rank's IndexError or gloo's 'Connection closed by peer'."""
    from labsupport.lab import tensor_parallel_disaggregated as module
    monkeypatch.setattr(module, "run_ranks", _refuse_to_start)
    arguments = {"requests": workload(2), "slots": 2, "block_size": 4, "timeout": 60, **change}
    with pytest.raises(LabError, match=words) as refused:
        serve_disaggregated(random_model("tiny-llama"), **arguments)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("change, words", [
    ({"ttft_slo": float("nan")}, "ttft_slo"), ({"tpot_slo": 0}, "tpot_slo"), ({"ttft_slo": -1.0}, "ttft_slo"),
    ({"token_budget": 1}, "token_budget"), ({"cores": 0}, "cores"), ({"slots": 0}, "slots"),
    ({"requests": [Request([1, 2], max_new_tokens=3, request_id=1), Request([3], max_new_tokens=3, request_id=1)]},
     "request_id"),
])
def test_the_comparison_refuses_its_arguments_before_serving_anything(monkeypatch, change, words):
    """Issue 50: a NaN or non-positive objective was refused only after both designs had served every request."""
    from labsupport.lab import tensor_parallel_disaggregated as module
    monkeypatch.setattr(module, "serve_disaggregated", _refuse_to_start)
    arguments = {"requests": workload(2), "slots": 2, "token_budget": 8, "ttft_slo": 1.0, "tpot_slo": 0.2, **change}
    with pytest.raises(LabError, match=words):
        compare_with_colocated(random_model("tiny-llama"), **arguments)
