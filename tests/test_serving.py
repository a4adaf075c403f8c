"""The serving engine (notebook 06): paged cache, schedulers, engine, workloads, metrics.

The correctness invariants: the paged cache gives the contiguous cache's logits;
every request gets the tokens it gets alone, whatever the policy, the neighbours
and the preemptions; no cache block leaks. Tiny models run in float64, where
batching cannot flip an argmax by rounding, so token equality is exact.
"""

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import KVCache, KVWriter, StaticKVCache
from labsupport.weights.fixtures import random_model
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import (BlockManager, Engine, PagedKVCache, Request, Scheduler,
                                       ServedSequence, blocks_needed)
from labsupport.lab.serving_workload import make_workload
from labsupport.lab.serving_metrics import reserved_vs_used, slot_bars, utilization_timeline, summarize
from paged_rows import PagedRows
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.engine.speculative import Draft, speculative_generate
from labsupport.lab.serving_workload import arrival_times, output_lengths
from serving_reference import alone, prompts


# --- the paged cache ----------------------------------------------------------------

def test_paged_logits_equal_contiguous_cache(tiny_model_f64):
    """Prefill three sequences of different lengths into scattered blocks, decode them
    together, and compare every row with the same sequence in a static cache."""
    block_size = 4
    blocks = BlockManager(num_blocks=40, block_size=block_size)
    cache = PagedKVCache(tiny_model_f64.config, 40, block_size, dtype=tiny_model_f64.dtype)
    runner = ModelRunner(tiny_model_f64, cache, blocks)
    seqs = [ServedSequence(Request(p, max_new_tokens=8), i, "cpu") for i, p in enumerate(prompts(3))]
    for seq in seqs:                       # grow in turns, so that block tables interleave
        blocks.grow(seq.index, 2)
    for seq in seqs:
        blocks.grow(seq.index, len(seq.tokens) + 3)
    assert blocks.table(0) != list(range(len(blocks.table(0))))         # not contiguous
    for seq in seqs:
        paged_prefill = runner.prefill(seq)
        static = StaticKVCache(tiny_model_f64.config, 1, 32, dtype=tiny_model_f64.dtype)
        reference = tiny_model_f64.logits(tiny_model_f64(torch.tensor([seq.tokens]), cache=static), at=-1)[0]
        torch.testing.assert_close(paged_prefill, reference, rtol=0, atol=1e-10)
        assert seq.num_cached == 0                          # the runner is pure: it moves no counter
        seq.num_cached = len(seq.tokens)                    # the scheduler's postprocess, by hand
        seq.output.append(int(reference.argmax()))
    for _ in range(3):                     # three batched decode steps
        logits = runner.decode(seqs)
        for row, seq in enumerate(seqs):
            full = tiny_model_f64.logits(tiny_model_f64(torch.tensor([seq.tokens])), at=-1)[0]   # no cache
            torch.testing.assert_close(logits[row], full, rtol=0, atol=1e-10)
            seq.num_cached += 1
            seq.output.append(int(full.argmax()))


def test_padding_rows_do_not_touch_real_rows(tiny_model_f64):
    blocks = BlockManager(num_blocks=10, block_size=4)
    cache = PagedKVCache(tiny_model_f64.config, 10, 4, dtype=tiny_model_f64.dtype)
    runner = ModelRunner(tiny_model_f64, cache, blocks)
    seq = ServedSequence(Request(prompts(1)[0], max_new_tokens=4), 0, "cpu")
    blocks.grow(0, len(seq.tokens) + 2)
    first = int(runner.prefill(seq).argmax())
    seq.num_cached = len(seq.tokens)
    seq.output.append(first)
    with_padding = runner.decode([seq], padding_rows=3)
    without = runner.decode([seq])                                         # the same step again
    assert with_padding.shape == (1, tiny_model_f64.config.vocab_size)
    torch.testing.assert_close(with_padding, without, rtol=0, atol=1e-10)


def paged_rows(model, rows: int, positions: int, block_size: int = 4):
    """A `PagedRows` cache of `rows` rows, their blocks interleaved in the pool (not contiguous)."""
    blocks = BlockManager(num_blocks=40, block_size=block_size)
    for grown in (2, positions):
        for row in range(rows):
            blocks.grow(row, grown)
    pool = PagedKVCache(model.config, 40, block_size, dtype=model.dtype)
    return PagedRows(pool, [blocks.table(row) for row in range(rows)])


def test_the_paged_side_implements_what_it_can_of_the_protocol(tiny_model_f64):
    pool = PagedKVCache(tiny_model_f64.config, 8, 4, dtype=tiny_model_f64.dtype)
    assert isinstance(PagedRows(pool, [[3, 1, 5]]), KVCache)                 # rows sharing one length
    view = pool.view(torch.tensor([[0]]), torch.tensor([[0]]), None)    # one pass, rows at their own lengths
    assert isinstance(view, KVWriter) and not isinstance(view, KVCache)
    assert not isinstance(pool, KVCache)                                # the pool: many lengths at once
    with pytest.raises(LabError, match="outside the pool"):
        PagedRows(pool, [[3, 8]])


def test_generate_on_the_paged_cache_gives_the_same_tokens(tiny_model_f64):
    batch = prompts(2)                                                  # lengths 5 and 9: left-padded
    expected = generate(tiny_model_f64, batch, 10, eos_token_ids=())
    cache = paged_rows(tiny_model_f64, 2, 9 + 10)
    assert cache.tables[0].tolist() != list(range(cache.tables.shape[1]))   # scattered blocks
    paged = generate(tiny_model_f64, batch, 10, eos_token_ids=(), cache=cache)
    assert paged.tokens.tolist() == expected.tokens.tolist()
    with pytest.raises(LabError, match="fixed-shape writes"):
        generate(tiny_model_f64, batch, 10, cache=paged_rows(tiny_model_f64, 2, 9 + 10), compile=True)


class WrongDraft(Draft):
    """Proposes the last token plus one, k times: mostly rejected, so the cache rolls back."""

    def propose(self, context, k):
        return [(context[-1] + 1) % 256] * k, None


def test_speculative_decoding_rolls_the_paged_cache_back(tiny_model_f64):
    prompt = prompts(1)[0]
    expected = generate(tiny_model_f64, prompt, 12, eos_token_ids=()).row(0)
    result = speculative_generate(tiny_model_f64, WrongDraft(), prompt, 12, k=3, eos_token_ids=(),
                                  cache=paged_rows(tiny_model_f64, 1, len(prompt) + 12))
    assert result.tokens == expected
    assert result.stats.rejected > 0                                    # truncate did roll back


# --- the engine: same tokens as alone, both policies, with preemption ------------------

def test_policies_are_objects_and_a_new_one_is_a_small_subclass(tiny_model_f64):
    """The names still work; a Policy object gives the same schedule; a custom policy
    (admit only into an empty server: batches of whatever is waiting, no padding rows)
    plugs into the same engine and still gives every request its tokens alone. A policy
    sees a read-only view and returns its decision; the scheduler applies it."""
    from labsupport.engine.serving import ContinuousBatching, Decision, Policy

    class DrainThenRefill(Policy):
        name = "drain-then-refill"

        def decide(self, view):
            return Decision(vacate=view.finished, admit=() if view.running else view.waiting)

    requests = make_workload(prompts(), count=8, median_new_tokens=6, max_new_tokens=12, seed=1)
    by_name = Engine(tiny_model_f64, max_slots=3, policy="continuous", block_size=4).run(requests, clock="steps")
    by_object = Engine(tiny_model_f64, max_slots=3, policy=ContinuousBatching(), block_size=4).run(
        requests, clock="steps")
    assert [s.output for s in by_object.sequences] == [s.output for s in by_name.sequences]
    assert len(by_object.steps) == len(by_name.steps) and by_object.policy == "continuous"
    custom = Engine(tiny_model_f64, max_slots=3, policy=DrainThenRefill(), block_size=4)
    result = custom.run(requests, clock="steps")
    assert result.policy == "drain-then-refill"
    assert [s.output for s in result.sequences] == [alone(tiny_model_f64, r) for r in requests]
    assert len(result.steps) > len(by_name.steps)            # it waits for the drain
    custom.blocks.assert_no_leaks()


def test_sampled_requests_survive_preemption(tiny_model_f64):
    sampling = SamplingConfig(temperature=1.0, top_k=20, seed=5)
    requests = make_workload(prompts(), count=8, median_new_tokens=12, max_new_tokens=30, seed=3,
                             sampling=sampling)
    roomy = Engine(tiny_model_f64, max_slots=4, block_size=4).run(requests, clock="steps")
    tight_engine = Engine(tiny_model_f64, max_slots=4, block_size=4, cache_tokens=48)
    tight = tight_engine.run(requests, clock="steps")
    assert summarize(tight)["preemptions"] > 0
    assert roomy.tokens() == tight.tokens()
    assert [alone(tiny_model_f64, r) for r in requests] == list(roomy.tokens().values())
    tight_engine.blocks.assert_no_leaks()


def test_end_of_sequence_and_streaming(tiny_model_f64):
    prompt = prompts(1)[0]
    sampling = SamplingConfig(temperature=1.0, seed=1)      # a random tiny model repeats itself when greedy
    free_run = alone(tiny_model_f64, Request(prompt, max_new_tokens=8, sampling=sampling))
    stop = next(k for k in range(1, 8) if free_run[k] not in free_run[:k])   # a token new at step k
    seen = []
    request = Request(prompt, max_new_tokens=20, sampling=sampling, eos_token_ids=(free_run[stop],),
                      on_token=seen.append)
    result = Engine(tiny_model_f64, max_slots=2).run([request])
    assert result.sequences[0].output == free_run[: stop + 1] == seen


# --- the scheduler's policies ------------------------------------------------------

def test_static_admits_a_batch_together_and_keeps_finished_rows(tiny_llama):
    lengths = [2, 9, 3, 4, 1]
    requests = [Request([1, 2, 3], max_new_tokens=n, request_id=i) for i, n in enumerate(lengths)]
    result = Engine(tiny_llama, max_slots=2, policy="static").run(requests, clock="steps")
    admitted = [s.admitted_at for s in result.sequences]
    assert admitted[0] == admitted[1]                     # seated together
    assert admitted[2] >= result.sequences[1].finished_at  # waited for the longest member
    padded = [r.padding_rows for r in result.steps]
    assert max(padded) == 1                               # request 0 ended early but kept its row
    continuous = Engine(tiny_llama, max_slots=2, policy="continuous").run(requests, clock="steps")
    assert continuous.sequences[2].admitted_at < admitted[2]
    assert len(continuous.steps) < len(result.steps)
    assert all(r.padding_rows == 0 for r in continuous.steps)


def test_continuous_scheduler_step_by_step():
    """One scheduler step: a finished sequence leaves and the next waiting one joins."""
    blocks = BlockManager(num_blocks=16, block_size=4)
    scheduler = Scheduler("continuous", max_slots=2, blocks=blocks)
    seqs = [ServedSequence(Request([1, 2, 3], max_new_tokens=5), i, "cpu") for i in range(3)]
    for s in seqs:
        scheduler.add(s)
    first = scheduler.schedule(now=0)
    assert first.prefill == seqs[:2] and first.decode == []
    for s in seqs[:2]:
        s.num_cached = len(s.tokens)
    scheduler.finish(seqs[0], now=1)
    second = scheduler.schedule(now=1)
    assert second.decode == [seqs[1]] and second.prefill == [seqs[2]]
    assert seqs[2].slot == seqs[0].slot


def test_preemption_frees_the_latest_and_requeues_it_first():
    blocks = BlockManager(num_blocks=4, block_size=2)
    scheduler = Scheduler("continuous", max_slots=4, blocks=blocks)
    a, b = (ServedSequence(Request([1, 2], max_new_tokens=6), i, "cpu") for i in range(2))
    scheduler.add(a), scheduler.add(b)
    scheduler.schedule(0)                                 # both admitted: 2 blocks each (3 positions)
    a.num_cached, b.num_cached = 4, 2                      # a needs a third block
    step = scheduler.schedule(1)
    assert step.preempted == [b] and step.decode == [a]
    assert scheduler.waiting[0] is b and b.num_cached == 0 and b.preemptions == 1
    assert blocks.table(b.index) == [] and len(blocks.table(a.index)) == 3


# --- bad input ------------------------------------------------------------------

def test_a_request_too_long_for_the_cache_is_refused_and_the_rest_served():
    model = random_model("tiny-llama", dtype=torch.float64)
    good = make_workload(prompts(3), max_new_tokens=8, seed=1)
    too_long = Request(list(range(60)), max_new_tokens=10, request_id="huge")
    engine = Engine(model, max_slots=2, block_size=4, cache_tokens=64)
    result = engine.run(good + [too_long], clock="steps")
    assert "huge" in result.rejected and "paged cache holds 64" in result.rejected["huge"]
    assert [s.output for s in result.sequences] == [alone(model, r) for r in good]
    with pytest.raises(LabError, match="cache_tokens"):
        engine.add_request(too_long)
    engine.blocks.assert_no_leaks()


@pytest.mark.parametrize("make, message", [
    (lambda m: Engine(m, max_slots=0), "max_slots .* must be at least 1"),
    (lambda m: Engine(m).run([]), "request list is empty"),
    (lambda m: Engine(m, policy="fifo"), "static' or 'continuous"),
    (lambda m: Request([], max_new_tokens=4), "prompt of request None is empty"),
    (lambda m: Request([1], max_new_tokens=0), "max_new_tokens of request None must be at least 1"),
    (lambda m: Engine(m).add_request(Request([1, 10**6])), "outside the vocabulary"),
    (lambda m: Engine(m, cache_tokens=10**6).add_request(Request([1] * 250, max_new_tokens=10)),
     "model's context holds"),
    (lambda m: Engine(m).run([Request([1])], clock="sundial"), "clock must be"),
    (lambda m: make_workload([[1]], rate=0), "arrival rate .* must be finite and > 0"),
    # adversarial: NaN, infinities, fractions, text, wrong types, zero-sized blocks
    (lambda m: Request([1], arrival=float("nan")), "arrival .* must be finite and >= 0, got nan"),
    (lambda m: Request([1], arrival=float("inf")), "must be finite"),
    (lambda m: Request([1], sampling=SamplingConfig(temperature=float("nan"))), "temperature .* got nan"),
    (lambda m: Request([1], max_new_tokens=2.5), "max_new_tokens of request None must be a whole number"),
    (lambda m: Request("hello"), "is text; give token ids instead"),
    (lambda m: Request([1.5, 2]), "token ids are whole numbers"),
    (lambda m: Request([1], eos_token_ids=2), "eos_token_ids .* must be a list"),
    (lambda m: Engine(m).add_request(Request([-1, 2])), "outside the vocabulary"),
    (lambda m: Engine(m, block_size=0), "block_size .* must be at least 1, got 0"),
    (lambda m: Engine(m, block_size=-4), "block_size .* must be at least 1, got -4"),
    (lambda m: Engine(m, block_size=2.5), "block_size .* must be a whole number"),
    (lambda m: Engine(m, cache_tokens=0), "cache_tokens .* must be at least 1"),
    (lambda m: Engine(m).run([[1, 2, 3]]), "serves Request objects"),
    (lambda m: make_workload([[1]], rate=float("nan")), "arrival rate .* got nan"),
    (lambda m: make_workload([[1]], sigma=-1), "sigma .* must be finite and >= 0"),
])
def test_bad_input_gets_one_sentence(tiny_llama, make, message):
    with pytest.raises(LabError, match=message):
        make(tiny_llama)


# --- workloads and metrics --------------------------------------------------------

def test_workload_is_seeded_and_long_tailed():
    assert output_lengths(50, seed=3) == output_lengths(50, seed=3)
    lengths = output_lengths(2000, median_new_tokens=16, sigma=1.0, max_new_tokens=512, seed=0)
    assert 14 <= sorted(lengths)[1000] <= 18                         # median near 16
    assert max(lengths) > 8 * 16                                      # a long tail
    arrivals = arrival_times(500, rate=4.0, seed=1)
    assert arrivals == sorted(arrivals) and abs(500 / arrivals[-1] - 4.0) < 0.6


def test_metrics_timeline_and_memory(tiny_llama):
    requests = make_workload(prompts(), count=12, rate=1.0, median_new_tokens=6, max_new_tokens=20, seed=2)
    result = Engine(tiny_llama, max_slots=3, block_size=4).run(requests, clock="steps")
    m = summarize(result)
    assert m["requests"] == 12 and m["tokens"] == sum(r.max_new_tokens for r in requests)
    assert 0 < m["slot_utilization"] <= 1 and m["ttft_p50"] <= m["latency_p50"] <= m["latency_p99"]
    assert m["throughput_tokens_per_s"] == pytest.approx(m["tokens"] / m["duration"])
    again = summarize(Engine(tiny_llama, max_slots=3, block_size=4).run(requests, clock="steps"))
    assert again == m                                                 # the steps clock is exact
    bars = slot_bars(result)
    assert len(bars) >= 12 and all(0 <= b["slot"] < 3 and b["end"] >= b["start"] for b in bars)
    for slot in range(3):                                             # never two requests in one slot
        spans = sorted((b["start"], b["end"]) for b in bars if b["slot"] == slot)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))
    timeline = utilization_timeline(result)
    assert len(timeline["start"]) == m["steps"] and max(timeline["busy_slots"]) <= 3
    memory = reserved_vs_used(result, max_length=tiny_llama.config.max_position)
    assert 0 < memory["used_bytes"] < memory["reserved_bytes"]
    assert blocks_needed(17, 16) == 2 and blocks_needed(16, 16) == 1


# --- the embedded model, and Hugging Face's continuous batching --------------------

@pytest.mark.slow
def test_embedded_model_serves_the_same_tokens_as_alone_and_as_hf(smollm, smollm_hf):
    from labsupport.lab.serving_workload import chat_prompts
    from labsupport.bench.peers.continuous_batching import hf_serve
    model, tokenizer = smollm
    requests = make_workload(chat_prompts(tokenizer, 4), median_new_tokens=6, max_new_tokens=12, seed=0)
    result = Engine(model, max_slots=3, block_size=8, cache_tokens=3 * 64).run(requests)
    ours = result.tokens()
    assert list(ours.values()) == [alone(model, r) for r in requests]
    before = smollm_hf.config._attn_implementation
    theirs = hf_serve(smollm_hf, requests, max_slots=3)
    assert theirs["tokens"] == ours
    assert smollm_hf.config._attn_implementation == before       # paged SDPA for the run only, never flash
