"""Prefix caching (notebook 06): block hashes, reference counts, LRU eviction, a shared
block never written, no leaks (cached blocks included), and every request's tokens equal
to those it gets alone, with chunked prefill and under forced preemption."""

import subprocess
import sys

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import BlockManager, Engine, PrefixCache, Request, block_hash
from labsupport.lab.serving_workload import make_workload
from labsupport.engine.serving.paged_cache import PagedView
from labsupport.engine.serving.prefix_cache import prefix_block_hashes
from labsupport.lab.serving_metrics import summarize
from serving_reference import alone, chat_like


# --- the hash of a block and its prefix ------------------------------------------------

def test_block_hash_names_the_tokens_and_the_prefix_before_them():
    first = block_hash(None, [1, 2, 3, 4])
    assert first == block_hash(None, (1, 2, 3, 4)) and 0 <= first < 2 ** 64
    assert block_hash(first, [5, 6]) != block_hash(block_hash(None, [9, 9, 9, 9]), [5, 6])   # other prefix
    assert block_hash(None, [1, 2, 3, 4]) != block_hash(None, [1, 2, 3, 5])
    assert block_hash(None, [12, 3]) != block_hash(None, [1, 23])                # no ambiguous joins
    assert block_hash(0, [1]) != block_hash(None, [1])
    code = "from labsupport.engine.serving import block_hash; print(block_hash(None, [1, 2, 3, 4]))"
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env={"PYTHONHASHSEED": "123", "OMP_NUM_THREADS": "1"})
    assert int(other_process.stdout) == first                                    # not salted per process
    assert prefix_block_hashes([1, 2, 3, 4, 5, 6, 7], 4) == [first]             # full blocks only
    assert prefix_block_hashes(list(range(8)), 4)[1] == block_hash(block_hash(None, [0, 1, 2, 3]), [4, 5, 6, 7])


def test_the_cache_counts_references_and_evicts_the_least_recently_used():
    cache = PrefixCache(block_size=2)
    prompt = [1, 2, 3, 4, 5, 6]                                # 3 full blocks
    assert cache.insert(prompt, table=[0, 1, 2]) == 3
    assert cache.insert(prompt, table=[5, 6, 7]) == 0          # the names are taken: 5-7 stay uncached
    assert cache.lookup([1, 2, 3, 4, 9, 9, 5, 6]) == [0, 1]    # the longest cached prefix
    assert cache.lookup([1, 2, 3]) == [0]                      # full blocks only
    cache.ref(1)                                               # a second sequence holds block 1
    for block in (2, 0, 1):
        cache.unref(block)
    assert cache.num_evictable == 2 and cache.refs[1] == 1     # block 1 is still held
    assert cache.evict() == 2 and cache.evict() == 0           # least recently released first
    assert cache.lookup([1, 2]) == [] and 2 not in cache
    with pytest.raises(LabError, match="No cached block is free to evict"):
        cache.evict()
    cache.unref(1)
    with pytest.raises(LabError, match="released more often than it was taken"):
        cache.unref(1)


# --- the block manager with prefix caching ------------------------------------------------

def test_sequences_share_full_prompt_blocks_and_diverge_into_their_own():
    blocks = BlockManager(num_blocks=20, block_size=4, prefix_caching=True)
    a = list(range(10)) + [50, 51]                            # 12 tokens: 3 full blocks
    b = list(range(10)) + [60, 61, 62]                        # same first 10 tokens
    assert blocks.admit(0, a, len(a) + 1) == 0                # nothing cached yet
    blocks.cache_full_blocks(0, a, num_cached=len(a))
    assert blocks.read_only_blocks() == set(blocks.table(0)[:3])
    assert blocks.admit(1, b, len(b) + 1) == 8                # blocks 0-1 shared, block 2 differs
    assert blocks.table(1)[:2] == blocks.table(0)[:2] and blocks.table(1)[2] != blocks.table(0)[2]
    assert blocks.admit(2, a, len(a) + 1) == 8                # the same prompt: its last block is recomputed
    assert blocks.table(2)[2] != blocks.table(0)[2]           # (so that its last token gives logits)
    assert blocks.prefix_cache.refs[blocks.table(0)[0]] == 3
    assert torch.equal(blocks.table_rows([0, 1, 2])[:, :4], torch.tensor([blocks.table(i) for i in range(3)]))
    for seq in (0, 1, 2):
        blocks.release(seq)
    blocks.assert_no_leaks()                                  # cached blocks stay, unreferenced
    assert blocks.prefix_cache.num_evictable == 3 and blocks.num_free == 20


def test_cached_blocks_are_evicted_only_when_their_room_is_needed():
    blocks = BlockManager(num_blocks=6, block_size=2, prefix_caching=True)
    prompt = [1, 2, 3, 4, 5]
    blocks.admit(0, prompt, 6)
    blocks.cache_full_blocks(0, prompt, 5)
    blocks.release(0)
    assert blocks.prefix_cache.num_evictable == 2 and len(blocks.free_blocks) == 4
    assert blocks.admit_cost([1, 2, 3, 4, 9], 6) == 3         # 1 new block + 2 cached ones taken off the free count
    blocks.grow(1, 8)                                         # 4 blocks: the free list is enough
    assert blocks.prefix_cache.evictions == 0
    first_block = blocks.cached_prefix(prompt)[0]
    blocks.grow(2, 2)                                         # now a cached block must go: the later one
    assert blocks.prefix_cache.evictions == 1 and blocks.cached_prefix(prompt + [6]) == [first_block]
    blocks.release(1), blocks.release(2)
    blocks.assert_no_leaks()


def test_assert_no_leaks_catches_a_leak_and_a_dangling_reference():
    blocks = BlockManager(num_blocks=4, block_size=2, prefix_caching=True)
    blocks.admit(0, [1, 2, 3], 4)
    blocks.cache_full_blocks(0, [1, 2, 3], 3)
    with pytest.raises(AssertionError, match="still owned"):
        blocks.assert_no_leaks()
    blocks.tables[1] = list(blocks.table(0))                  # a second holder, not counted
    with pytest.raises(AssertionError, match="Reference counts .* do not match"):
        blocks.assert_no_leaks()
    blocks.tables.pop(1), blocks.tables.pop(0)                # forget the owner without releasing
    with pytest.raises(AssertionError, match="accounting is broken"):
        blocks.assert_no_leaks()


# --- the engine with prefix caching ----------------------------------------------------

def test_the_write_guard_catches_a_write_to_a_cached_block(tiny_llama, guard_writes):
    engine = Engine(tiny_llama, max_slots=2, block_size=4, prefix_caching=True)
    guard_writes.append(engine)
    engine.run([Request(list(range(1, 10)), max_new_tokens=2)], clock="steps")
    cached = next(iter(engine.blocks.read_only_blocks()))
    view = engine.cache.view(torch.tensor([[cached]]), torch.tensor([[0]]), None)
    with pytest.raises(AssertionError, match="a shared block was written"):
        view.update(0, *[torch.zeros(1, tiny_llama.config.num_kv_heads, 1, tiny_llama.config.head_dim)] * 2)


def test_prefix_caching_computes_fewer_prompt_tokens(tiny_llama):
    requests = make_workload(chat_like(system=24), count=10, median_new_tokens=4, max_new_tokens=8, seed=1)
    plain = summarize(Engine(tiny_llama, max_slots=4, block_size=4).run(requests, clock="steps"))
    shared = Engine(tiny_llama, max_slots=4, block_size=4, prefix_caching=True).run(requests, clock="steps")
    m = summarize(shared)
    assert m["prefix_caching"] is True and plain["prefix_cached_tokens"] == 0
    assert m["prefill_tokens_computed"] == plain["prefill_tokens_computed"] - m["prefix_cached_tokens"]
    assert m["prefill_tokens_computed"] <= 0.5 * plain["prefill_tokens_computed"]
    assert shared.tokens() == Engine(tiny_llama, max_slots=4, block_size=4).run(requests, clock="steps").tokens()


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [None, SamplingConfig(temperature=0.8, top_k=20, seed=1)])
def test_embedded_model_chunked_and_cached_under_preemption_gives_the_tokens_alone(smollm, sampling):
    from labsupport.lab.serving_workload import chat_prompts
    model, tokenizer = smollm
    extra = {} if sampling is None else {"sampling": sampling}
    requests = make_workload(chat_prompts(tokenizer, 3), median_new_tokens=8, max_new_tokens=8, min_new_tokens=8,
                             seed=0, **extra)
    longest = max(len(r.prompt) for r in requests) + 8
    engine = Engine(model, max_slots=3, block_size=8, cache_tokens=longest + 8, token_budget=16,
                    prefix_caching=True)
    result = engine.run(requests, clock="steps")
    assert list(result.tokens().values()) == [alone(model, r) for r in requests]
    m = summarize(result)
    assert m["prefix_cached_tokens"] > 0 and m["preemptions"] > 0
    engine.blocks.assert_no_leaks()
