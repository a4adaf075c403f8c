"""The checker of notebook 06's exercise 3: one step's new keys written into the paged pool, each
sequence's block table grown from the free list as its positions need (the write side of
`PagedKVCache`, with the block manager's `grow`). It compares a learner's function with the package's
cache and prints a short confirmation or raises `CheckFailed` with a hint.
"""

from __future__ import annotations

import random

import torch

from ..errors import LabError
from ..engine.config import PRESETS, ModelConfig
from ..engine.serving.block_manager import BlockManager, blocks_needed
from ..engine.serving.paged_cache import PagedKVCache
from .grading import Exercise, graded
from . import CheckFailed, fail, grades_quietly, passed

WRITE = "one step's keys written into the paged pool"
SERVING = "labsupport.engine.serving."
WRITE_EXERCISE = Exercise(
    title=WRITE, teaches="one step's keys written into the paged pool, each block table grown from the free list",
    computed_by=tuple(SERVING + path for path in (
        "paged_cache.PagedKVCache", "paged_cache.PagedKVCache.slots", "paged_cache.PagedKVCache.view",
        "paged_cache.PagedKVCache.packed_view", "paged_cache.PagedView", "paged_cache.PagedView.write",
        "paged_cache.PagedView.update", "block_manager.BlockManager", "block_manager.BlockManager.grow")))


def reference_paged_write(pool_keys: torch.Tensor, tables, lengths, new_keys, free_blocks, block_size: int) -> None:
    """Store one step's new keys for a batch of sequences in one layer's pool, in place.

    Introduced in notebook 06 (continuous batching). pool_keys: (num_slots, kv_heads, head_dim),
    one layer of `PagedKVCache.keys`; tables[i]: sequence i's block table (a list, extended in
    place); lengths[i]: the positions it holds before the step; new_keys[i]: (n_i, kv_heads,
    head_dim), its keys for positions lengths[i] .. lengths[i] + n_i - 1; free_blocks: the free
    block ids (a list), from which a sequence takes a block whenever its positions need one more.
    Raises LabError when free_blocks runs out (the scheduler should have preempted first).
    """
    for table, length, keys in zip(tables, lengths, new_keys):
        end = length + len(keys)
        while len(table) * block_size < end:                        # the last block is full (or there is none)
            if not free_blocks:
                raise LabError(f"No free block is left for positions up to {end}; the scheduler must preempt first.")
            table.append(free_blocks.pop())
        positions = torch.arange(length, end, device=pool_keys.device)
        blocks = torch.as_tensor(table, dtype=torch.long, device=pool_keys.device)
        pool_keys[blocks[positions // block_size] * block_size + positions % block_size] = keys


# each typical slip as the slots it writes (positions p, the table t, block_size b, the sequence's length n)
_WRITE_SLIPS = [
    (lambda p, t, b, n: p,
     "block_table[p // block_size] is the physical block: using the logical block index p // block_size "
     "as if it were physical writes into blocks that belong to other sequences."),
    (lambda p, t, b, n: t[p % b] * b + p // b,
     "the block comes from the quotient and the offset from the remainder: "
     "slot = block_table[p // block_size] * block_size + p % block_size."),
    (lambda p, t, b, n: t[(p - n) // b] * b + (p - n) % b,
     "the new keys go at positions lengths[i] .. lengths[i] + n - 1, after the ones the sequence holds; "
     "yours start again at position 0 and overwrite its first keys."),
    (lambda p, t, b, n: t[(p - 1) // b] * b + (p - 1) % b,
     "position lengths[i] is the first free one (0 .. lengths[i] - 1 are taken); yours starts one position "
     "early and overwrites the sequence's newest key."),
    (lambda p, t, b, n: t[(p + 1) // b] * b + (p + 1) % b,
     "position lengths[i] is the first free one; yours starts one position late and leaves a hole."),
    (lambda p, t, b, n: t[p // b] * b + p % b + 1,
     "the offset inside a block is p % block_size (0 .. block_size - 1); yours is one position too far."),
    (lambda p, t, b, n: (t[p // b] + 1) * b + p % b,
     "block ids count from 0: block k starts at slot k * block_size, not (k + 1) * block_size."),
]


def _write_cases(config: ModelConfig):
    """(name, pool, layer, block_size, tables, lengths, new_keys): sequences already in a pool, their
    blocks handed out in a scrambled order, and one step's new keys for each: decodes that fit in the
    last block or need a new one, a newcomer with no block yet, chunks that cross several blocks."""
    cases = (("block_size 4", 0, 4, (9, 3, 16, 0, 13), (1, 1, 1, 6, 12)),
             ("block_size 8", 1, 8, (20, 8, 5, 17, 0), (1, 1, 11, 16, 1)),
             ("block_size 2", 2, 2, (7, 2, 4), (3, 1, 5)))
    for name, seed, block_size, lengths, chunks in cases:
        need = sum(blocks_needed(n + c, block_size) for n, c in zip(lengths, chunks))
        manager = BlockManager(num_blocks=need + 4, block_size=block_size)
        random.Random(seed).shuffle(manager.free_blocks)
        for step in range(max(lengths)):                      # grow in turns: the tables interleave
            for i, n in enumerate(lengths):
                if step < n:
                    manager.grow(i, step + 1)
        pool = PagedKVCache(config, manager.num_blocks, block_size)
        generator = torch.Generator().manual_seed(seed)
        layer = seed % config.num_layers
        for i, n in enumerate(lengths):
            if n:
                keys = torch.randn(1, config.num_kv_heads, n, config.head_dim, generator=generator)
                view = pool.view(torch.tensor([manager.table(i)]), torch.arange(n)[None], None)
                view.write(layer, keys, keys.clone())                     # the package's own write
        new_keys = [torch.randn(c, config.num_kv_heads, config.head_dim, generator=generator) for c in chunks]
        tables = [list(manager.table(i)) for i in range(len(lengths))]
        yield name, pool.keys[layer], block_size, tables, list(lengths), new_keys, list(manager.free_blocks)


def _slots(tables, lengths, chunks, block_size, slip=None):
    """The slots of every sequence's new positions (one tensor), through `slip` if given."""
    out = []
    for table, n, c in zip(tables, lengths, chunks):
        positions, table = torch.arange(n, n + c), torch.as_tensor(table, dtype=torch.long)
        if slip is None:
            out.append(table[positions // block_size] * block_size + positions % block_size)
        else:
            out.append(slip(positions, table, block_size, n))
    return torch.cat(out)


def _written(before: torch.Tensor, slots: torch.Tensor, new_keys) -> torch.Tensor:
    """`before` with the new keys (in sequence order) written at `slots`."""
    after = before.clone()
    after[slots] = torch.cat(list(new_keys))
    return after


def _table_hint(old: list, got: list, length: int, chunk: int, block_size: int) -> str:
    """Why sequence's table `got` (it held `old`) does not hold the blocks its positions need."""
    want = blocks_needed(length + chunk, block_size)
    if len(got) < want:
        if len(got) > len(old):
            return ("a chunk can fill more than one block: keep taking blocks until the table holds "
                    "ceil((lengths[i] + n) / block_size) of them.")
        return ("its last block is full (or it has none): take a new block from free_blocks and append it to its "
                "table before writing.")
    return ("the last block still has room for len(table) * block_size - lengths[i] positions: take a new "
            "block only for positions beyond them (ceil((lengths[i] + n) / block_size) - len(table) new blocks).")


def _error_hint(tables, got_tables, lengths, chunks, free, block_size) -> str:
    """The hint for a write that raised: from the tables it had grown by then, when they tell."""
    grown = [i for i, (old, got) in enumerate(zip(tables, got_tables)) if len(got) > len(old)]
    taken = [b for i in grown for b in got_tables[i][len(tables[i]):]]
    if any(b not in free for b in taken):
        return "a new block must come from free_blocks: the others belong to sequences or do not exist."
    for i in grown:
        if len(got_tables[i]) != blocks_needed(lengths[i] + chunks[i], block_size):
            return _table_hint(tables[i], got_tables[i], lengths[i], chunks[i], block_size)
    return ("sequence i needs ceil((lengths[i] + n) / block_size) blocks, the new ones from free_blocks, before its "
            "keys go to the slots table[p // block_size] * block_size + p % block_size of positions p = "
            "lengths[i] .. lengths[i] + n - 1.")


@grades_quietly
@graded(WRITE_EXERCISE)
def check_paged_write(fn, config: ModelConfig | None = None) -> None:
    """Check `fn(pool_keys, tables, lengths, new_keys, free_blocks, block_size)`: one step's keys written
    into one layer's pool in place, each table grown from the free list as its positions need.

    Introduced in notebook 06 (continuous batching). The pool holds sequences written by the package
    (`PagedKVCache`), their blocks in a scrambled order; after the call every sequence is read back
    through its own table: its old keys, then its new ones. Any free block may be taken.
    config: the model whose cache shapes to use (notebook 06 passes its own; default: tiny-llama).
    """
    config = config or PRESETS["tiny-llama"]
    for name, pool_keys, block_size, tables, lengths, new_keys, free in _write_cases(config):
        chunks = [len(k) for k in new_keys]
        case = (f"{name}: block tables {tables}, lengths {lengths}, chunks of {chunks} new keys, "
                f"free blocks {free}")
        got_pool, got_tables, got_free = pool_keys.clone(), [list(t) for t in tables], list(free)
        try:
            fn(got_pool, got_tables, list(lengths), [k.clone() for k in new_keys], got_free, block_size)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as error:                       # noqa: BLE001 - the learner's code failed
            fail(WRITE, "the keys written in place", f"{type(error).__name__}: {str(error)[:80]}",
                 f"{_error_hint(tables, got_tables, lengths, chunks, free, block_size)} Case: {case}")
        for i, (old, got, n, c) in enumerate(zip(tables, got_tables, lengths, chunks)):
            if list(got[:len(old)]) != old:
                fail(WRITE, f"sequence {i}'s table to begin with {old}", got,
                     f"keep the blocks a sequence holds; append its new blocks at the end of its table. Case: {case}")
            if len(got) != blocks_needed(n + c, block_size):
                fail(WRITE, f"{blocks_needed(n + c, block_size)} blocks for sequence {i} "
                     f"({n} + {c} positions)", f"{len(got)} blocks: {got}",
                     f"{_table_hint(old, got, n, c, block_size)} Case: {case}")
        taken = [b for old, got in zip(tables, got_tables) for b in got[len(old):]]
        if any(b not in free for b in taken):
            fail(WRITE, f"new blocks out of the free list {free}", f"blocks {taken}",
                 "a new block must come from free_blocks: the others belong to sequences or do not exist. "
                 f"Case: {case}")
        if len(set(taken)) < len(taken) or sorted(got_free + taken) != sorted(free):
            fail(WRITE, f"free_blocks without the {len(taken)} blocks taken", got_free,
                 "take each new block out of free_blocks (e.g. free_blocks.pop()), so that no other sequence "
                 f"gets it too. Case: {case}")
        want = _written(pool_keys, _slots(got_tables, lengths, chunks, block_size), new_keys)
        if torch.equal(got_pool, want):
            continue
        if torch.equal(got_pool, pool_keys):
            fail(WRITE, "the new keys in pool_keys", "pool_keys unchanged",
                 "write into pool_keys itself, in place: pool_keys[slots] = keys. Indexing with a tensor makes a "
                 f"copy, so pool_keys[slots].copy_(keys) or a new tensor is lost. Case: {case}")
        for slip, hint in _WRITE_SLIPS:
            try:
                slots = _slots(got_tables, lengths, chunks, block_size, slip)
            except IndexError:
                continue
            if bool(((slots >= 0) & (slots < len(pool_keys))).all()) and torch.equal(
                    got_pool, _written(pool_keys, slots, new_keys)):
                fail(WRITE, "the keys at their positions' slots", "keys at other slots", f"{hint} Case: {case}")
        for i, (table, n, c) in enumerate(zip(got_tables, lengths, chunks)):
            slots = _slots([table], [0], [n + c], block_size)
            read, expect = got_pool[slots], want[slots]
            if not torch.equal(read, expect):
                p = int((read != expect).flatten(1).any(1).nonzero()[0])
                what = "an old key" if p < n else "a new key"
                fail(WRITE, f"sequence {i}'s keys at positions 0 .. {n + c - 1}", f"{what} changed at position {p}",
                     f"position {p} lives at slot table[{p} // {block_size}] * {block_size} + {p} % {block_size} = "
                     f"{int(slots[p])}. Case: {case}")
        fail(WRITE, "only the new positions' slots written", "other slots changed too",
             f"write each new key at its own slot only; the rest of the pool belongs to others. Case: {case}")
    _check_runs_out(fn, config)
    passed(WRITE, "A sequence takes a block only when its last one is full: memory grows with what it holds.")


def _check_runs_out(fn, config: ModelConfig) -> None:
    """Two decodes that each need a new block, with one free block: the write must raise."""
    pool = torch.zeros(6 * 4, config.num_kv_heads, config.head_dim)
    keys = [torch.ones(1, config.num_kv_heads, config.head_dim) for _ in range(2)]
    try:
        fn(pool, [[0, 1], [2]], [8, 4], keys, [5], 4)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception:                                    # noqa: BLE001 - any error refuses the impossible write
        return
    fail(WRITE, "an error", "no error",
         "two sequences each need a new block and free_blocks holds one: raise an error (the scheduler must "
         "preempt first) instead of writing where no block was given. Case: tables [[0, 1], [2]], lengths [8, 4], "
         "one new key each, free blocks [5], block_size 4")
