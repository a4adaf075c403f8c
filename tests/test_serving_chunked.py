"""Chunked prefill under a token budget (notebook 06): the scheduler's plan, one ragged
forward pass per step, and every request's tokens equal to those it gets alone, with
and without preemption. Tiny models run in float64, where batching cannot flip an argmax."""

import numpy as np
import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.models.masks import chunk_mask
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import (BlockManager, Engine, PagedKVCache, Request, Scheduler,
                                       ServedSequence, budget_prefill_chunks)
from labsupport.lab.serving_workload import make_workload
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.lab.serving_metrics import summarize
from serving_reference import alone, prompts

LONG = (5, 9, 3, 23, 7, 4, 17, 6)          # two prompts longer than a small token budget


# --- the budget, as a pure function ----------------------------------------------------

def test_budget_prefill_chunks_fills_the_budget_in_order():
    assert budget_prefill_chunks(16, 3, [5, 20, 4]) == [5, 8, 0]       # 3 decodes + 5 + 8 = 16
    assert budget_prefill_chunks(16, 0, [4, 4]) == [4, 4]               # room to spare
    assert budget_prefill_chunks(8, 8, [7, 1]) == [0, 0]                # decodes take it all
    assert budget_prefill_chunks(8, 2, []) == []
    with pytest.raises(LabError, match="budget is 8; give a token_budget of at least max_slots"):
        budget_prefill_chunks(8, 9, [1])


def context_mask(context_lengths, window):
    """The decode mask written out: row b's one query sits at context_lengths[b] - 1 and sees
    the keys at or before it (within the window). (B, 1, 1, S), S = the longest context."""
    query = context_lengths[:, None] - 1                                         # (B, 1)
    keys = torch.arange(int(context_lengths.max()))[None, :]                    # (1, S)
    seen = (keys <= query) & (True if window is None else keys > query - window)
    return seen[:, None, None, :]


def test_chunk_mask_is_causal_after_each_rows_own_context():
    positions = torch.tensor([[2, 2, 3], [5, 6, 7]])          # row 0: one padding query, then 2, 3
    mask = chunk_mask(positions, window=None)
    assert mask.shape == (2, 1, 3, 8)
    assert mask[0, 0, 1].tolist() == [True] * 3 + [False] * 5
    assert mask[0, 0, 2].tolist() == [True] * 4 + [False] * 4
    assert mask[1, 0, 0].tolist() == [True] * 6 + [False] * 2
    decode = torch.tensor([[4], [1]])                          # one query each: the decode mask
    assert torch.equal(chunk_mask(decode, window=None), context_mask(decode[:, 0] + 1, window=None))
    assert torch.equal(chunk_mask(decode, window=2), context_mask(decode[:, 0] + 1, window=2))


# --- one ragged forward pass equals the model without a cache ---------------------------

def test_a_ragged_pass_of_chunks_and_decodes_gives_the_full_models_logits(tiny_model_f64):
    model = tiny_model_f64
    blocks = BlockManager(num_blocks=40, block_size=4)
    cache = PagedKVCache(model.config, 40, 4, dtype=model.dtype)
    runner = ModelRunner(model, cache, blocks)
    seqs = [ServedSequence(Request(p, max_new_tokens=8), i, "cpu") for i, p in enumerate(prompts(3))]
    for grown in (2, 40):
        for seq in seqs:
            blocks.grow(seq.index, grown)
    runner.forward([seqs[0]], [5])                            # seq 0: whole prompt: next, a decode
    seqs[0].num_cached = 5                                    # (the scheduler's postprocess, by hand)
    seqs[0].output.append(3)
    runner.forward([seqs[1]], [4])                            # seq 1: a first chunk of its prompt
    seqs[1].num_cached = 4
    logits = runner.forward(seqs, [1, 3, 2])                  # a decode, a middle chunk, a first chunk
    for row, (seq, upto) in enumerate(zip(seqs, (6, 7, 2))):
        full = model.logits(model(torch.tensor([seq.tokens[:upto]])), at=-1)[0]             # no cache at all
        torch.testing.assert_close(logits[row], full, rtol=0, atol=1e-10)
    assert [s.num_cached for s in seqs] == [5, 4, 0]          # the runner is pure: no counter moved


# --- the scheduler under a budget ----------------------------------------------------

def test_a_step_under_the_budget_decodes_first_then_fills_with_chunks():
    blocks = BlockManager(num_blocks=64, block_size=4)
    scheduler = Scheduler("continuous", max_slots=4, blocks=blocks, token_budget=10)
    seqs = [ServedSequence(Request([1] * n, max_new_tokens=4), i, "cpu") for i, n in enumerate((3, 4, 30, 5))]
    for s in seqs:
        scheduler.add(s)
    first = scheduler.schedule(now=0)
    assert first.decode == [] and first.prefill == seqs[:3] and first.chunks == [3, 4, 3]   # several newcomers
    assert list(scheduler.waiting) == [seqs[3]]               # no token left for it: not admitted yet
    finished, failed = scheduler.postprocess(first, [(seqs[0], 7), (seqs[1], 7)], now=1)   # prompts done: first tokens
    assert finished == [] and failed == []
    assert [s.num_cached for s in seqs] == [3, 4, 3, 0] and [s.output for s in seqs[:2]] == [[7], [7]]
    second = scheduler.schedule(now=1)
    assert second.decode == seqs[:2]
    assert second.prefill == [seqs[2]] and second.chunks == [8]   # the long prompt goes on; 2 + 8 = 10
    assert list(scheduler.waiting) == [seqs[3]]


def test_postprocess_owns_every_counter_after_a_step_and_a_failing_callback_fails_alone():
    blocks = BlockManager(num_blocks=64, block_size=4, prefix_caching=True)
    scheduler = Scheduler("continuous", max_slots=3, blocks=blocks, token_budget=None)
    seen = []

    def broken(token):
        raise ValueError("the client's callback broke")
    seqs = [ServedSequence(Request([1, 2, 3, 4, 5], max_new_tokens=1), 0, "cpu"),
            ServedSequence(Request([6, 7], max_new_tokens=3, on_token=broken), 1, "cpu"),
            ServedSequence(Request([8, 9, 10], max_new_tokens=3, on_token=seen.append), 2, "cpu")]
    for s in seqs:
        scheduler.add(s)
    plan = scheduler.schedule(now=0)
    assert [n for _, n in plan.computed] == [5, 2, 3]
    table = list(blocks.table(0))
    finished, failed = scheduler.postprocess(plan, [(s, 40 + s.index) for s in seqs], now=1)
    assert [s.num_cached for s in seqs] == [5, 2, 3]
    assert finished == [seqs[0]] and seqs[0].status.value == "finished" and blocks.table(0) == []
    assert [(s, str(e)) for s, e in failed] == [(seqs[1], "the client's callback broke")]
    assert seen == [42] and seqs[2].output == [42]
    assert blocks.prefix_cache.lookup([1, 2, 3, 4, 5, 6]) == table[:1]   # its one full prompt block: named


def test_a_long_prompt_is_split_and_emits_only_when_done(tiny_llama):
    request = Request(list(range(1, 40)), max_new_tokens=3)
    result = Engine(tiny_llama, max_slots=2, block_size=4, token_budget=8).run([request], clock="steps")
    chunks = [r.prefill_tokens for r in result.steps]
    assert chunks[:5] == [8, 8, 8, 8, 7] and sum(chunks) == 39
    assert [r.prefills for r in result.steps[:5]] == [0, 0, 0, 0, 1]
    assert result.sequences[0].first_token_at == 5            # the step that ended the prompt
    assert result.sequences[0].output == alone(tiny_llama, request)


def test_one_forward_pass_per_step_and_the_budget_is_kept(tiny_llama, monkeypatch):
    calls = []
    original = ModelRunner.forward

    def counting(self, seqs, chunks, padding_rows=0):
        calls.append(sum(chunks))
        return original(self, seqs, chunks, padding_rows)

    monkeypatch.setattr(ModelRunner, "forward", counting)
    requests = make_workload(prompts(8, lengths=LONG), count=10, rate=0.8, median_new_tokens=6, max_new_tokens=16, seed=2)
    result = Engine(tiny_llama, max_slots=4, block_size=4, token_budget=9).run(requests, clock="steps")
    assert len(calls) == len(result.steps) and max(calls) <= 9
    assert any(r.decode_rows and r.prefill_chunks for r in result.steps)        # mixed steps happen
    assert any(r.prefill_chunks >= 2 for r in result.steps)                     # several prompts in one pass
    assert sum(r.prefill_tokens for r in result.steps) == sum(len(r.prompt) for r in requests)
    calls.clear()
    unchunked = Engine(tiny_llama, max_slots=4, block_size=4).run(requests, clock="steps")
    assert len(calls) > len(unchunked.steps)                   # newcomers prefilled alone


# --- the invariant: the tokens a request gets alone ---------------------------------

# --- metrics and bad input -----------------------------------------------------------

def test_token_times_and_latency_metrics(tiny_llama):
    requests = make_workload(prompts(8, lengths=LONG), count=8, rate=1.0, median_new_tokens=6, max_new_tokens=12, seed=2)
    result = Engine(tiny_llama, max_slots=3, block_size=4, token_budget=6).run(requests, clock="steps")
    for seq in result.sequences:
        assert len(seq.token_times) == len(seq.output)
        assert seq.token_times[0] == seq.first_token_at and seq.token_times[-1] == seq.finished_at
        assert seq.token_times == sorted(seq.token_times)
    m = summarize(result)
    gaps = [b - a for s in result.sequences for a, b in zip(s.token_times, s.token_times[1:])]
    assert m["itl_p50"] == pytest.approx(float(np.percentile(gaps, 50)))
    assert m["itl_p99"] == pytest.approx(float(np.percentile(gaps, 99)))
    assert 1 <= m["itl_p50"] <= m["itl_p99"] <= max(gaps)      # the steps clock: at least one step apart
    tpot = [(s.finished_at - s.first_token_at) / (len(s.output) - 1) for s in result.sequences]
    assert m["tpot_p50"] == pytest.approx(float(np.percentile(tpot, 50))) and m["tpot_p99"] <= max(tpot)
    assert m["token_budget"] == 6 and m["prefix_caching"] is False and m["prefix_cached_tokens"] == 0
    assert m["prefill_tokens_computed"] == sum(len(r.prompt) for r in requests)


def test_a_request_that_never_fits_is_refused_and_the_rest_chunked(tiny_llama):
    good = make_workload(prompts(4, lengths=LONG), max_new_tokens=8, seed=1)
    huge = Request(list(range(60)), max_new_tokens=10, request_id="huge")
    engine = Engine(tiny_llama, max_slots=2, block_size=4, cache_tokens=64, token_budget=5, prefix_caching=True)
    result = engine.run(good + [huge], clock="steps")
    assert list(result.rejected) == ["huge"] and "paged cache holds 64" in result.rejected["huge"]
    assert [s.output for s in result.sequences] == [alone(tiny_llama, r) for r in good]
    engine.blocks.assert_no_leaks()


@pytest.mark.parametrize("kwargs, message", [
    ({"max_slots": 4, "token_budget": 3}, r"token_budget .*at least max_slots = 4.* must be at least 4, got 3"),
    ({"token_budget": 0}, "token_budget .* must be at least"),
    ({"token_budget": 12.5}, "token_budget .* must be a whole number"),
    ({"token_budget": "16"}, "token_budget .* must be a whole number"),
    ({"prefix_caching": "yes"}, "prefix_caching must be True or False, got 'yes'"),
    ({"prefix_caching": 1}, "prefix_caching must be True or False, got 1"),
])
def test_bad_budget_or_prefix_setting_gets_one_sentence(tiny_llama, kwargs, message):
    with pytest.raises(LabError, match=message):
        Engine(tiny_llama, **kwargs)
