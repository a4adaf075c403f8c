"""Notebook 06 (continuous batching): the narrow policy interface (a read-only view in, a
decision out, applied by the scheduler); bad input at every public argument of the
scheduler, the policies, the block manager, the prefix cache, a served sequence and the
int8 cache; and each stateful object used again for a second run. Tiny models run in
float64, where batching cannot flip an argmax, so token equality is exact."""

import dataclasses

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.kv_quant import Int8KVCache
from labsupport.engine.serving import (POLICIES, BlockManager, ContinuousBatching, Decision, Engine, Policy,
                                       PagedKVCache, PrefixCache, Request, Scheduler, SchedulerView,
                                       ServedSequence, StaticBatching)
from labsupport.engine.config import PRESETS
from labsupport.lab.serving_workload import make_workload
from serving_reference import DrainThenRefill, ShortestPromptFirst, alone, chat_like

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def workload(n=8, seed=1, **kwargs):
    return make_workload(chat_like(n, system=6), count=n, median_new_tokens=6, max_new_tokens=12, seed=seed,
                         **kwargs)


# --- the interface: a view in, a decision out ----------------------------------------------

class Spy(ContinuousBatching):
    """Continuous batching that keeps every view it was shown."""

    name = "spy"

    def __init__(self):
        self.views = []

    def decide(self, view):
        self.views.append(view)
        return super().decide(view)


def test_a_policy_sees_a_read_only_view_and_returns_a_decision(tiny_model_f64):
    requests = workload()
    spy = Spy()
    result = Engine(tiny_model_f64, max_slots=3, policy=spy, block_size=4, token_budget=6).run(requests,
                                                                                              clock="steps")
    plain = Engine(tiny_model_f64, max_slots=3, policy="continuous", block_size=4, token_budget=6).run(
        requests, clock="steps")
    assert result.tokens() == plain.tokens() and len(result.steps) == len(plain.steps)
    assert len(spy.views) == len(result.steps)
    for view in spy.views:
        assert isinstance(view, SchedulerView)
        assert all(isinstance(getattr(view, f), tuple) for f in ("waiting", "running", "decoding", "finished"))
        assert 0 <= view.free_slots <= 3 and view.token_budget == 6 and view.free_blocks >= 0
        assert set(map(id, view.decoding)) <= set(map(id, view.running))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spy.views[0].free_slots = 99
    assert any(v.finished for v in spy.views) and any(v.waiting for v in spy.views)


def test_policies_keep_their_names_and_a_custom_order_is_one_small_subclass(tiny_model_f64):
    assert POLICIES == {"static": StaticBatching, "continuous": ContinuousBatching}
    requests = [Request(list(range(1, 1 + n)), max_new_tokens=3, request_id=n) for n in (9, 2, 6, 4)]
    engine = Engine(tiny_model_f64, max_slots=1, policy=ShortestPromptFirst(), block_size=4)
    result = engine.run(requests, clock="steps")
    order = sorted(result.sequences, key=lambda s: s.admitted_at)
    assert [s.id for s in order] == [2, 4, 6, 9]                 # shortest first, not first come
    assert result.tokens() == {r.request_id: alone(tiny_model_f64, r) for r in requests}
    engine.blocks.assert_no_leaks()


@pytest.mark.parametrize("policy", [StaticBatching(), ContinuousBatching(), DrainThenRefill()], ids=str)
def test_one_policy_object_serves_two_engines_stepping_side_by_side(tiny_model_f64, policy):
    """A policy holds no state: two engines share one object, stepped in turns."""
    requests, other = workload(seed=1), workload(seed=2)
    expected = [Engine(tiny_model_f64, max_slots=3, policy=type(policy)(), block_size=4).run(r, clock="steps")
                for r in (requests, other)]
    engines = [Engine(tiny_model_f64, max_slots=3, policy=policy, block_size=4) for _ in range(2)]
    for engine, reqs in zip(engines, (requests, other)):
        for request in reqs:
            engine.add_request(request)
    while any(e.scheduler.has_work for e in engines):
        for engine in engines:
            if engine.scheduler.has_work:
                engine.step()
    for engine, want in zip(engines, expected):
        assert [s.output for s in engine.sequences] == [s.output for s in want.sequences]
        assert [r.padding_rows for r in engine.steps] == [r.padding_rows for r in want.steps]
        engine.blocks.assert_no_leaks()


# --- bad decisions, bad input ---------------------------------------------------------------

def scheduler_with(decide=None, victim=None, max_slots=2, num_blocks=16, token_budget=None):
    """A scheduler whose policy answers with `decide(view)` / `victim(view)`, three sequences queued."""

    class Scripted(ContinuousBatching):
        name = "scripted"

    if decide is not None:
        Scripted.decide = lambda self, view: decide(view)
    if victim is not None:
        Scripted.victim = lambda self, view: victim(view)
    scheduler = Scheduler(Scripted(), max_slots, BlockManager(num_blocks, 2), token_budget)
    seqs = [ServedSequence(Request([1, 2, 3], max_new_tokens=8), i, "cpu") for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    return scheduler, seqs


STRANGER = ServedSequence(Request([5]), 99, "cpu")


@pytest.mark.parametrize("decide, message", [
    (lambda v: None, "decide must return a Decision, got NoneType"),
    (lambda v: {"admit": v.waiting}, "decide must return a Decision, got dict"),
    (lambda v: Decision(admit=(STRANGER,)), "decided to admit a sequence that is not waiting"),
    (lambda v: Decision(admit=v.waiting + v.waiting), "decided to admit .*or one twice"),
    (lambda v: Decision(vacate=v.waiting[:1]), "decided to vacate a sequence that is not finished"),
    (lambda v: Decision(admit=v.waiting, padding_rows=-1), "padding_rows .* must be from 0 to 2, got -1"),
    (lambda v: Decision(admit=v.waiting, padding_rows=1.5), "padding_rows .* must be a whole number"),
    (lambda v: Decision(admit=v.waiting, padding_rows=3), "padding_rows .*at most the 2 slots.* got 3"),
    (lambda v: Decision(admit=5), "must list sequences in admit and vacate"),
])
def test_a_policys_bad_decision_gets_one_sentence(decide, message):
    scheduler, _ = scheduler_with(decide)
    with pytest.raises(LabError, match=message):
        scheduler.schedule(0)


def test_a_victim_that_is_not_running_gets_one_sentence():
    scheduler, seqs = scheduler_with(victim=lambda view: view.waiting[0], max_slots=2, num_blocks=4)
    scheduler.schedule(0)                                 # two admitted, 2 blocks each: the cache is full
    seqs[0].num_cached = 4                                # seq 0 needs a third block
    with pytest.raises(LabError, match="chose a victim that is not running"):
        scheduler.schedule(1)


@pytest.mark.parametrize("make, message", [
    (lambda b: Scheduler("fifo", 2, b), "Unknown scheduling policy 'fifo'"),
    (lambda b: Scheduler(StaticBatching, 2, b), "Unknown scheduling policy"),       # the class, not an object
    (lambda b: Scheduler("static", 0, b), "max_slots .* must be at least 1, got 0"),
    (lambda b: Scheduler("static", 2.5, b), "max_slots .* must be a whole number"),
    (lambda b: Scheduler("static", 2, "blocks"), "blocks must be a BlockManager, got str"),
    (lambda b: Scheduler("static", 4, b, token_budget=3), "token_budget .* must be at least 4, got 3"),
    (lambda b: Scheduler("static", 2, b, token_budget=7.5), "token_budget .* must be a whole number"),
    (lambda b: Scheduler("static", 2, b, token_budget="16"), "token_budget .* must be a whole number"),
    (lambda b: Scheduler("static", 2, b).add([1, 2, 3]), "queues ServedSequence objects, got a list"),
    (lambda b: Scheduler("static", 2, b).schedule(float("nan")), "now .* must be finite and >= 0, got nan"),
    (lambda b: Scheduler("static", 2, b).schedule(-1), "now .* must be finite and >= 0"),
    (lambda b: Scheduler("static", 2, b).finish(ServedSequence(Request([1]), 0, "cpu"), 0), "is not running"),
])
def test_bad_scheduler_input_gets_one_sentence(make, message):
    with pytest.raises(LabError, match=message):
        make(BlockManager(8, 2))


def test_a_sequence_queued_twice_or_finished_twice_gets_one_sentence():
    scheduler, seqs = scheduler_with()
    with pytest.raises(LabError, match="already queued"):
        scheduler.add(seqs[0])
    scheduler.schedule(0)
    scheduler.finish(seqs[0], 1)
    with pytest.raises(LabError, match="is not running"):
        scheduler.finish(seqs[0], 2)
    with pytest.raises(LabError, match="finished or already queued"):
        scheduler.add(seqs[0])


@pytest.mark.parametrize("make, message", [
    (lambda: BlockManager(0, 4), "num_blocks .* must be at least 1, got 0"),
    (lambda: BlockManager(2.5, 4), "num_blocks .* must be a whole number"),
    (lambda: BlockManager("8", 4), "num_blocks .* must be a whole number"),
    (lambda: BlockManager(8, 0), "block_size .* must be at least 1, got 0"),
    (lambda: BlockManager(8, 4.0), "block_size .* must be a whole number"),
    (lambda: BlockManager(8, 4, prefix_caching="yes"), "prefix_caching must be True or False"),
    (lambda: BlockManager(8, 4, device="tpu"), "Unknown device 'tpu'"),
    (lambda: BlockManager(8, 4).grow(-1, 4), "seq_index .* must be at least 0, got -1"),
    (lambda: BlockManager(8, 4).grow(0, 2.5), "num_positions .* must be a whole number"),
    (lambda: BlockManager(8, 4).grow(0, 10 ** 6), "needs 250000 more cache blocks and only 8 are free"),
    (lambda: PagedKVCache(PRESETS["tiny-llama"], 0, 4), "num_blocks .* must be at least 1, got 0"),
    (lambda: PagedKVCache(PRESETS["tiny-llama"], 8, 2.5), "block_size .* must be a whole number"),
    (lambda: PrefixCache(2).insert([1, 2, 3, 4], table=[0]), "fill 2 blocks but the table holds only 1"),
    (lambda: PrefixCache(2).ref(3), "Block 3 is not in the prefix cache"),
    (lambda: PrefixCache(2).unref(3), "Block 3 is not in the prefix cache"),
    (lambda: PrefixCache(2).evict(), "No cached block is free to evict"),
    (lambda: ServedSequence([1, 2], 0, "cpu"), "serves Request objects, got a list"),
    (lambda: ServedSequence(Request([1]), -1, "cpu"), "index .* must be at least 0, got -1"),
])
def test_bad_block_manager_prefix_cache_and_sequence_input_gets_one_sentence(make, message):
    with pytest.raises(LabError, match=message):
        make()


def test_a_block_manager_refuses_a_second_admission_and_names_only_blocks_it_holds():
    blocks = BlockManager(8, 2, prefix_caching=True)
    blocks.admit(0, [1, 2, 3], 4)
    with pytest.raises(LabError, match="already holds blocks"):
        blocks.admit(0, [1, 2, 3], 4)
    with pytest.raises(LabError, match="num_cached .* at most the 4 .* got 6"):
        blocks.cache_full_blocks(0, [1, 2, 3, 4, 5, 6], 6)
    blocks.release(0)
    blocks.assert_no_leaks()


@pytest.mark.parametrize("layer, k, v, message", [
    (-1, (1, 2, 3, 16), (1, 2, 3, 16), "layer must be a whole number from 0 to 1, got -1"),
    (2, (1, 2, 3, 16), (1, 2, 3, 16), "from 0 to 1, got 2"),
    (1.0, (1, 2, 3, 16), (1, 2, 3, 16), "got 1.0"),
    (True, (1, 2, 3, 16), (1, 2, 3, 16), "got True"),
    (0, (2, 2, 3, 16), (2, 2, 3, 16), r"k must be .* \(1, 2, 'T', 16\), got torch.float32 of shape \(2, 2, 3, 16\)"),
    (0, (1, 2, 3, 8), (1, 2, 3, 8), "k must be float keys or values"),
    (0, (1, 2, 3, 16), (1, 2, 4, 16), "k and v must have one shape"),
    (0, (1, 2, 3, 16), "int", "v must be float keys or values .* got torch.int64"),
    (0, (1, 2, 3, 16), None, "v must be .* got NoneType"),
])
def test_int8_cache_write_refuses_bad_layers_and_shapes(tiny_llama, layer, k, v, message):
    cache = Int8KVCache.for_model(tiny_llama, 1, 16)
    as_tensor = {None: None, "int": torch.ones(1, 2, 3, 16, dtype=torch.long)}
    k = torch.randn(k)
    v = as_tensor[v] if v in as_tensor else torch.randn(v)
    with pytest.raises(LabError, match=message):
        cache.write(layer, k, v, start=0)
    assert cache.length == 0 and not cache.keys.any()                    # nothing was written


def test_int8_cache_refuses_a_config_that_is_not_one():
    with pytest.raises(LabError, match="config must be a ModelConfig"):
        Int8KVCache("smollm2-135m", 1, 16)
    with pytest.raises(LabError, match="config must be a ModelConfig"):
        Int8KVCache({"num_layers": 2}, 1, 16)


# --- reuse: a second run on the same objects -------------------------------------------------

@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("token_budget", [None, 5])
def test_an_engine_serves_a_second_run_alike(tiny_model_f64, guard_writes, policy, prefix_caching, token_budget):
    """`Engine.run` starts afresh (issue 26, item 2): the second run of the same engine, over the
    same cache memory, gives the same tokens, the very same step plan, and leaks nothing;
    shared blocks are never written in either run."""
    setting = dict(max_slots=3, policy=policy, block_size=4, cache_tokens=64, token_budget=token_budget,
                   prefix_caching=prefix_caching)
    requests = workload(n=8, rate=1.0)
    engine = Engine(tiny_model_f64, **setting)
    guard_writes.append(engine)
    one = engine.run(requests, clock="steps")
    engine.blocks.assert_no_leaks()
    assert not engine.scheduler.has_work and engine.scheduler.running == []
    two = engine.run(requests, clock="steps")
    engine.blocks.assert_no_leaks()
    assert one.tokens() == two.tokens() == {r.request_id: alone(tiny_model_f64, r) for r in requests}
    records = lambda result: [dataclasses.astuple(r) for r in result.steps]
    assert records(two) == records(one)
    assert sorted(engine.scheduler.free_slots + [s.slot for s in engine.scheduler.finished]) == [0, 1, 2]


def test_an_int8_cache_emptied_serves_a_second_generation_alike(tiny_model_f64):
    model = tiny_model_f64
    prompt = list(range(3, 15))
    cache = Int8KVCache.for_model(model, 1, 40)
    first = generate(model, prompt, 12, eos_token_ids=(), cache=cache).row(0)
    cache.truncate(0)
    second = generate(model, prompt, 12, eos_token_ids=(), cache=cache).row(0)
    fresh = generate(model, prompt, 12, eos_token_ids=(), cache=Int8KVCache.for_model(model, 1, 40)).row(0)
    assert first == second == fresh


def test_a_policy_that_never_admits_into_an_idle_server_is_refused_not_looped_on(tiny_model_f64):
    """A custom policy that admits nothing while nothing runs would make the engine step forever:
    one sentence instead, at the first such step."""
    from labsupport.engine.serving import Decision, Policy

    class NeverAdmits(Policy):
        name = "never-admits"

        def decide(self, view):
            return Decision(vacate=(), admit=(), padding_rows=0)

    engine = Engine(tiny_model_f64, max_slots=2, policy=NeverAdmits(), block_size=4, cache_tokens=32)
    with pytest.raises(LabError, match="admitted none of the 1 waiting request"):
        engine.run([Request(prompt=[1, 2, 3], max_new_tokens=2)], clock="steps")
