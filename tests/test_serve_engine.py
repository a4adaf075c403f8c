"""The serving engine as a server drives it (notebook 09): reuse, duplicate ids, abort, record=False.

Issue 26: a reused `Engine` mixed its runs (the second result held the first run's
sequences, steps and metrics, on two clocks that each restarted at 0), and two requests
with one `request_id` were both accepted while `tokens()` kept one answer. Each test here
fails on that code.
"""

import pytest
import torch

from labsupport.engine.generation import generate
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import Engine, Request, Status
from labsupport.errors import LabError
from labsupport.lab.serving_metrics import summarize
from labsupport.lab.serving_workload import make_workload
from serving_reference import alone, prompts


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_reused_engine_gives_each_run_alone_what_a_new_engine_gives(tiny_llama, prefix_caching):
    first = make_workload(prompts(), count=6, rate=0.5, median_new_tokens=6, max_new_tokens=12, seed=1)
    second = make_workload(prompts(4, seed=7), count=5, rate=1.0, median_new_tokens=5, max_new_tokens=10, seed=2)
    reused = Engine(tiny_llama, max_slots=3, block_size=4, prefix_caching=prefix_caching)
    a = reused.run(first, clock="steps")
    a_tokens, a_steps = a.tokens(), len(a.steps)
    b = reused.run(second, clock="steps")
    fresh = Engine(tiny_llama, max_slots=3, block_size=4, prefix_caching=prefix_caching).run(second, clock="steps")
    assert len(b.sequences) == len(second) and b.tokens() == fresh.tokens()
    assert len(b.steps) == len(fresh.steps) and [s.start for s in b.steps] == [s.start for s in fresh.steps]
    for key in ("requests", "tokens", "steps", "duration", "prefill_tokens_computed", "prefix_cached_tokens"):
        assert summarize(b)[key] == summarize(fresh)[key], key
    assert b.peak_blocks == fresh.peak_blocks
    assert a.tokens() == a_tokens and len(a.steps) == a_steps           # the first result is untouched
    reused.blocks.assert_no_leaks()


def test_duplicate_request_ids_are_refused(tiny_llama):
    twins = [Request([1, 2, 3], max_new_tokens=4, request_id="a"), Request([4, 5], max_new_tokens=4, request_id="a")]
    with pytest.raises(LabError, match="'a' appears more than once"):
        Engine(tiny_llama).run(twins)
    engine = Engine(tiny_llama)
    engine.add_request(twins[0])
    with pytest.raises(LabError, match="'a' is already in use"):
        engine.add_request(twins[1])
    assert len(engine.sequences) == 1 and len(engine.scheduler.waiting) == 1          # nothing else changed
    # an implicit id (the arrival index, 0) and an explicit 0 cannot share one answer either
    result = Engine(tiny_llama).run([Request([1, 2], max_new_tokens=3), Request([3, 4], max_new_tokens=3,
                                                                                request_id=0)])
    assert len(result.tokens()) == len(result.sequences) == 1 and "already in use" in " ".join(result.rejected.values())


def test_run_refuses_while_requests_added_by_hand_are_in_flight(tiny_llama):
    engine = Engine(tiny_llama)
    engine.add_request(Request([1, 2, 3], max_new_tokens=4, request_id="x"))
    with pytest.raises(LabError, match="still serving 1 request"):
        engine.run([Request([1], max_new_tokens=2)])
    assert engine.abort("x") and not engine.has_work
    assert engine.run([Request([1], max_new_tokens=2)]).tokens()        # now it runs, afresh


@pytest.mark.parametrize("where", ["waiting", "running", "mid-prompt"])
def test_abort_frees_blocks_and_leaves_the_others_untouched(tiny_model_f64, where):
    engine = Engine(tiny_model_f64, max_slots=2, block_size=4, token_budget=4 if where == "mid-prompt" else None,
                    record=False)
    requests = [Request(p, max_new_tokens=8, request_id=i) for i, p in enumerate(prompts(3))]
    seqs = [engine.add_request(r) for r in requests]
    out = {i: [] for i in range(3)}
    engine.step()
    victim = {"waiting": 2, "running": 0, "mid-prompt": 0}[where]
    assert seqs[victim].status is (Status.WAITING if where == "waiting" else Status.RUNNING)
    assert (0 < seqs[victim].num_cached < len(requests[victim].prompt)) == (where == "mid-prompt")
    assert engine.abort(victim) and not engine.abort(victim)            # a second abort finds nothing
    assert seqs[victim].status is Status.FINISHED and victim not in engine.live
    for _ in range(40):
        if not engine.has_work:
            break
        for seq, token in engine.step():
            out[seq.id].append(token)
    assert not engine.has_work and engine.sequences == [] and engine.steps == []      # record=False keeps nothing
    for i, request in enumerate(requests):
        if i != victim:
            assert seqs[i].output == alone(tiny_model_f64, request)
    engine.blocks.assert_no_leaks()


def test_a_server_engine_forgets_finished_requests_and_refuses_run(tiny_llama):
    engine = Engine(tiny_llama, max_slots=2, record=False)
    for i in range(3):                                  # the same id again once the first has finished
        engine.add_request(Request([1, 2, 3], max_new_tokens=2, request_id="same",
                                   sampling=SamplingConfig(temperature=1.0, seed=i)))
        while engine.has_work:
            engine.step()
    assert engine.live == {} and engine.sequences == [] and engine.steps == []
    with pytest.raises(LabError, match="record=False"):
        engine.run([Request([1], max_new_tokens=2)])
    with pytest.raises(LabError, match="record must be True or False"):
        Engine(tiny_llama, record="yes")
    with pytest.raises(LabError, match="Request objects"):
        engine.require_servable([1, 2, 3])
