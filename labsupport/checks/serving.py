"""Checkers for notebook 06 (continuous batching): one scheduler step, the blocks a set of
sequences needs, a sequence's keys gathered from the paged pool, a block's hash in the prefix
cache and a scheduler step under a token budget. Each compares a learner's function with the
reference and prints a short confirmation or raises `CheckFailed` with a hint.
"""

from __future__ import annotations

import itertools
import numbers
import random

import torch

from ..engine.models.config import PRESETS, ModelConfig
from ..engine.serving.block_manager import BlockManager, blocks_needed
from ..engine.serving.paged_cache import PagedKVCache
from ..engine.serving.scheduler import budget_prefill_chunks
from .processes import hashes_text, stable_across_processes
from . import call_learner, fail, grades_quietly, passed, refuses_references

STEP = "one scheduler step"
BLOCKS = "blocks for a set of sequences"
GATHER = "a sequence's keys gathered through its block table"


def reference_schedule_step(running, waiting, max_slots, free_blocks, policy="continuous"):
    """Who leaves the batch and who joins it before the next step. Introduced in notebook 06 (continuous batching).
    running: [(seq_id, finished)] in the batch now; waiting: [(seq_id, blocks_needed)] in
    order of arrival; free_blocks: blocks free once the finished sequences have released
    theirs. Continuous: finished sequences leave; waiting ones join first come, first
    served while a slot and their blocks are free, stopping at the first that does not
    fit (nobody jumps the queue). Static: nobody leaves or joins until every member
    has finished; then the whole batch leaves and a new one is admitted the same way.
    Returns (leaving ids, joining ids).
    """
    finished = [sid for sid, done in running if done]
    if policy == "static":
        if len(finished) < len(running):
            return [], []
        leaving, staying = finished, 0
    else:
        leaving = finished
        staying = len(running) - len(finished)
    joining, slots, blocks = [], max_slots - staying, free_blocks
    for sid, need in waiting:
        if slots == 0 or need > blocks:
            break
        joining.append(sid)
        slots -= 1
        blocks -= need
    return leaving, joining


def _step_cases():
    """(running, waiting, max_slots, free_blocks, policy, what the case is about)."""
    return [
        ([("a", True), ("b", False), ("c", False), ("d", True)], [("e", 2), ("f", 2), ("g", 2)], 4, 20,
         "continuous", "two finished, three waiting, plenty of blocks"),
        ([("a", False), ("b", False)], [("c", 1), ("d", 1)], 2, 10, "continuous", "no slot is free"),
        ([], [("a", 3), ("b", 3), ("c", 3)], 2, 100, "continuous", "an empty batch with 2 slots"),
        ([("a", True), ("b", False)], [("c", 5), ("d", 1)], 4, 4, "continuous",
         "the first waiting sequence does not fit in the free blocks, the second would"),
        ([("a", True), ("b", True), ("c", False)], [("d", 1), ("e", 1), ("f", 1)], 3, 2, "continuous",
         "slots for two, blocks for two"),
        ([("a", True), ("b", False), ("c", True)], [("d", 1), ("e", 1)], 3, 10, "static",
         "static batching, one member still running"),
        ([("a", True), ("b", True), ("c", True)], [("d", 1), ("e", 1), ("f", 1), ("g", 1)], 3, 10, "static",
         "static batching, every member finished"),
        ([], [("a", 2), ("b", 9), ("c", 1)], 4, 10, "static", "static batching, blocks for the first only"),
    ]


@grades_quietly
def check_schedule_step(fn) -> None:
    """Check `fn(running, waiting, max_slots, free_blocks, policy) -> (leaving, joining)`.

    Introduced in notebook 06 (continuous batching)."""
    for running, waiting, max_slots, free_blocks, policy, about in _step_cases():
        want = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
        got = None
        try:
            got = fn(list(running), list(waiting), max_slots, free_blocks, policy)
            leaving, joining = (list(x) for x in got)
        except (TypeError, ValueError):
            fail(STEP, "a pair (leaving, joining) of lists of ids", repr(got)[:80],
                 "return two lists, e.g. `return leaving, joining`")
        case = (f"{policy}, running {running}, waiting {waiting}, max_slots={max_slots}, "
                f"free_blocks={free_blocks} ({about})")
        if leaving != want[0]:
            if policy == "static" and want[0] == [] and leaving:
                hint = "in static batching a finished member keeps its slot until the whole batch has finished."
            elif policy == "static" and want[0] and not leaving:
                hint = "once every member of a static batch has finished, the whole batch leaves together."
            else:
                hint = "the sequences that have finished leave (in the order they are in the batch)."
            fail(STEP, f"leaving={want[0]}", f"leaving={leaving}", f"{hint} Case: {case}")
        if joining == want[1]:
            continue
        staying = len(running) - len(want[0]) if policy == "continuous" else (
            len(running) if want[0] == [] else 0)
        waiting_ids = [sid for sid, _ in waiting]
        need = dict(waiting)
        if len(joining) > max_slots - staying:
            hint = (f"only {max_slots - staying} slots are free ({max_slots} minus the {staying} sequences "
                    "that stay); admit no more than that.")
        elif sum(need.get(sid, 0) for sid in joining) > free_blocks:
            hint = f"the joining sequences need more than the {free_blocks} free blocks; stop when the next one does not fit."
        elif joining != waiting_ids[:len(joining)]:
            hint = ("first come, first served: admit from the front of the queue and stop at the first "
                    "sequence that does not fit; a later, smaller one must not jump the queue.")
        elif policy == "static" and want[1] == []:
            hint = "in static batching nobody joins until every member of the batch has finished."
        elif policy == "static":
            hint = "once the whole static batch has finished, its slots are all free for a new batch."
        else:
            hint = ("a finished sequence frees its slot at once: free slots = max_slots minus the "
                    "sequences still running.")
        fail(STEP, f"joining={want[1]}", f"joining={joining}", f"{hint} Case: {case}")
    passed(STEP, "Continuous batching refills a slot the step after it frees; static waits for the whole batch.")


def reference_blocks_for(lengths, block_size) -> int:
    """Blocks a set of sequences holds in a paged cache: each one rounds up on its own.
    Introduced in notebook 06 (continuous batching)."""
    return sum(blocks_needed(n, block_size) for n in lengths)


@grades_quietly
def check_blocks_for(fn) -> None:
    """Check `fn(lengths, block_size) -> int`: the sum over sequences of ceil(length / block_size).

    Introduced in notebook 06 (continuous batching)."""
    cases = [([17, 16, 1], 16), ([5, 5, 5, 5], 4), ([100], 16), ([], 16), ([1, 2, 3], 1), ([33, 47, 8, 64], 16),
             ([15, 15], 16)]
    for lengths, block_size in cases:
        want = reference_blocks_for(lengths, block_size)
        try:
            got = fn(list(lengths), block_size)
        except (TypeError, ValueError, ZeroDivisionError) as error:
            fail(BLOCKS, "an integer", f"an error: {error}", "return the number of blocks as an int")
        if isinstance(got, numbers.Real) and not isinstance(got, bool) and got != int(got):
            fail(BLOCKS, f"{want} blocks for lengths {lengths}, block_size {block_size}", got,
                 "a fraction of a block is still a whole block: round each sequence up to an integer "
                 "number of blocks (ceil), then add.")
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            fail(BLOCKS, "an integer", repr(got)[:60], "return the number of blocks as an int")
        got = int(got)
        if got == want:
            continue
        total = sum(lengths)
        if got == -(-total // block_size):
            hint = ("blocks are not shared between sequences: round up for each sequence on its own, "
                    "then add; the ceiling of the total undercounts the partly filled last blocks.")
        elif got == sum(n // block_size for n in lengths) or got == total // block_size:
            hint = "a sequence with a partly filled last block still needs that block: round up, not down."
        elif got == sum(n // block_size + 1 for n in lengths):
            hint = ("n // block_size + 1 adds a block too many when a length is an exact multiple of "
                    "block_size: round up with -(-n // block_size).")
        elif lengths and got == len(lengths) * blocks_needed(max(lengths), block_size):
            hint = ("each sequence holds blocks for its own length, not for the longest one: that is the "
                    "per-slot reservation a paged cache avoids.")
        elif got == total:
            hint = "that counts positions, not blocks: divide each length by block_size (rounding up)."
        else:
            hint = "sum over the sequences of ceil(length / block_size), e.g. -(-length // block_size)."
        fail(BLOCKS, f"{want} for lengths {lengths}, block_size {block_size}", got, hint)
    passed(BLOCKS, "Each sequence wastes less than one block: at most block_size - 1 positions.")


# --- a sequence's keys, gathered from the paged pool through its block table --------------

def reference_paged_gather(pool_keys: torch.Tensor, block_table, length: int, block_size: int) -> torch.Tensor:
    """Positions 0 .. length - 1 of one sequence, read from one layer's pool.

    Introduced in notebook 06 (continuous batching). pool_keys: (num_slots, kv_heads,
    head_dim), one layer of `PagedKVCache.keys`; block_table: the sequence's physical
    blocks in logical order. Position p lives at slot
    block_table[p // block_size] * block_size + p % block_size. Returns (length, kv_heads, head_dim).
    """
    positions = torch.arange(length, device=pool_keys.device)
    table = torch.as_tensor(block_table, dtype=torch.long, device=pool_keys.device)
    slots = table[positions // block_size] * block_size + positions % block_size     # (length,)
    return pool_keys[slots]


# each typical slip as the slots it reads (positions p, the table, block_size b) and its hint
_GATHER_SLIPS = [
    (lambda p, t, b: p,
     "block_table[p // block_size] is the physical block: using the logical block index p // block_size "
     "as if it were physical reads blocks that belong to other sequences."),
    (lambda p, t, b: t[p % b] * b + p // b,
     "the block comes from the quotient and the offset from the remainder: "
     "slot = block_table[p // block_size] * block_size + p % block_size."),
    (lambda p, t, b: t[p // b] * b + p % b + 1,
     "the offset inside a block is p % block_size (0 .. block_size - 1); yours is one position too far."),
    (lambda p, t, b: t[p // b] * b + p % b - 1,
     "the offset inside a block is p % block_size (0 .. block_size - 1); yours is one position short."),
    (lambda p, t, b: (t[p // b] + 1) * b + p % b,
     "block ids count from 0: block k starts at slot k * block_size, not (k + 1) * block_size."),
    (lambda p, t, b: t[p // b + 1] * b + p % b,
     "position p lies in logical block p // block_size (counting from 0); yours reads the next block of the table."),
    (lambda p, t, b: t[(p + 1) // b] * b + p % b,
     "position p lies in logical block p // block_size; (p + 1) // block_size is one block off at each block's "
     "last position."),
]


def _gather_cases(config: ModelConfig):
    """(pool, layer, block_size, {sequence: (table, length, its keys as the pool's gather reads them)}):
    blocks handed out in a scrambled order, so that tables are neither adjacent nor increasing."""
    for seed, block_size, lengths in ((0, 4, (9, 3, 16, 1, 13)), (1, 8, (20, 8, 5, 17)), (2, 2, (7, 2, 4))):
        manager = BlockManager(num_blocks=sum(blocks_needed(n, block_size) for n in lengths) + 3,
                               block_size=block_size)
        random.Random(seed).shuffle(manager.free_blocks)
        for step in range(max(lengths)):                      # grow in turns: the tables interleave
            for i, n in enumerate(lengths):
                if step < n:
                    manager.grow(i, step + 1)
        pool = PagedKVCache(config, manager.num_blocks, block_size)
        generator = torch.Generator().manual_seed(seed)
        layer = seed % config.num_layers
        sequences = {}
        for i, n in enumerate(lengths):
            keys = torch.randn(1, config.num_kv_heads, n, config.head_dim, generator=generator)  # (1, kv_heads, n, D)
            view = pool.view(torch.tensor([manager.table(i)]), torch.arange(n)[None], torch.tensor([n]))
            gathered, _ = view.update(layer, keys, keys.clone())           # scatter, then gather: (1, kv_heads, n, D)
            sequences[i] = (manager.table(i), n, gathered[0].transpose(0, 1))   # (n, kv_heads, D)
        yield pool, layer, block_size, sequences


def _slip_hint(got: torch.Tensor, pool_keys: torch.Tensor, table, length: int, block_size: int) -> str | None:
    """The hint of the first typical slip whose slots give exactly `got`, or None."""
    positions, num_slots = torch.arange(length), pool_keys.shape[0]
    table = torch.as_tensor(table)
    for slots_of, hint in _GATHER_SLIPS:
        try:
            slots = slots_of(positions, table, block_size)
        except IndexError:
            continue
        if bool(((slots >= 0) & (slots < num_slots)).all()) and torch.equal(got, pool_keys[slots]):
            return hint
    return None


@grades_quietly
def check_paged_gather(fn, config: ModelConfig | None = None) -> None:
    """Check `fn(pool_keys, block_table, length, block_size) -> (length, kv_heads, head_dim)` against
    what `PagedKVCache`'s own gather reads back, for sequences whose blocks are scattered over the pool.

    Introduced in notebook 06 (continuous batching). config: the model whose cache shapes to use
    (notebook 06 passes its own model's; default: the tiny-llama preset).
    """
    config = config or PRESETS["tiny-llama"]
    for pool, layer, block_size, sequences in _gather_cases(config):
        pool_keys = pool.keys[layer]                                     # (num_slots, kv_heads, head_dim)
        for i, (table, length, want) in sequences.items():
            case = f"sequence {i}: block table {table}, length {length}, block_size {block_size}"
            try:
                got = fn(pool_keys.clone(), list(table), length, block_size)
            except (IndexError, RuntimeError, TypeError, ValueError) as error:
                fail(GATHER, f"a tensor of shape {tuple(want.shape)}", f"an error: {str(error)[:80]}",
                     "position p lives at slot block_table[p // block_size] * block_size + p % block_size; "
                     f"read positions 0 .. length - 1 only. Case: {case}")
            if not isinstance(got, torch.Tensor):
                fail(GATHER, f"a tensor of shape {tuple(want.shape)}", type(got).__name__,
                     f"return the gathered keys as one tensor, e.g. pool_keys[slots]. Case: {case}")
            if got.shape != want.shape:
                rows, blocks = got.shape[0] if got.dim() else None, len(table)
                if got.dim() == 3 and rows == blocks * block_size and rows != length:
                    hint = ("the last block is only partly filled: keep the first `length` positions, not "
                            "whole blocks (the rest of the block holds nothing of this sequence).")
                elif got.dim() == 3 and rows == (length // block_size) * block_size:
                    hint = ("you left out the partly filled last block: its first length % block_size positions "
                            "belong to the sequence too.")
                elif got.dim() == 3 and tuple(got.shape) == (want.shape[1], length, want.shape[2]):
                    hint = "positions come first, as the pool stores them: (length, kv_heads, head_dim)."
                else:
                    hint = "one row per position 0 .. length - 1, each of shape (kv_heads, head_dim)."
                fail(GATHER, f"shape {tuple(want.shape)}", f"shape {tuple(got.shape)}", f"{hint} Case: {case}")
            if torch.equal(got, want):
                continue
            wrong = int((got != want).flatten(1).any(1).nonzero()[0])
            hint = _slip_hint(got, pool_keys, table, length, block_size) or (
                f"position {wrong} lives at slot block_table[{wrong} // {block_size}] * {block_size} + "
                f"{wrong} % {block_size} = {table[wrong // block_size] * block_size + wrong % block_size}.")
            fail(GATHER, "the keys written for this sequence", f"other keys at position {wrong}",
                 f"{hint} Case: {case}")
    passed(GATHER, "A block table turns scattered blocks back into one contiguous sequence.")


# --- the engine's second half: a block's name in the prefix cache, a step under a token budget --------

HASH, BUDGET = "the hash of a block and its prefix", "a scheduler step under a token budget"


@grades_quietly
def check_block_hash(fn) -> None:
    """Check `fn(parent_hash, block_tokens) -> int`, a block's name in the prefix cache: an
    integer that depends on every token, their order and the parent's hash, the same on every
    call and in every process. Introduced in notebook 06 (continuous batching).

    The last check runs `fn` (with the helpers it calls) in two fresh Pythons of different hash
    seeds; a call of the built-in hash() on text, even inside a helper, is refused before it."""
    block = [11, 12, 13, 14]
    got = call_learner(HASH, "an integer", "your function raised an error on fn(None, [11, 12, 13, 14]).",
                       fn, None, list(block))
    if isinstance(got, bool) or not isinstance(got, numbers.Integral) or not -2**63 <= got < 2**64:
        fail(HASH, "an integer of at most 64 bits", repr(got)[:60],
             "return an int, e.g. int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), 'little').")
    parent = fn(None, [1, 2, 3, 4])
    if fn(None, list(block)) != got or fn(None, tuple(block)) != got or fn(parent, list(block)) != fn(parent, block):
        fail(HASH, "the same hash on every call for the same tokens", "different hashes",
             "hash the token ids themselves (not the list object, its id() or a random salt).")
    if fn(parent, block) == got or fn(parent, block) == fn(fn(None, [5, 6, 7, 8]), block):
        fail(HASH, "different hashes for the same tokens after different prefixes", "the same hash",
             "mix the parent's hash into the block's hash: the name must stand for the whole prefix, "
             "or two prompts that differ early would share a later block.")
    if fn(None, [5, 11, 12, 14]) == fn(None, [9, 11, 12, 14]) or fn(None, [11, 12, 13, 15]) == got:
        fail(HASH, "a different hash when any one token changes", "the same hash",
             "hash every token of the block, not only the last (or the first) one.")
    if fn(None, [14, 13, 12, 11]) == got or fn(None, [12, 11, 13, 14]) == got:
        fail(HASH, "a different hash when the tokens are reordered", "the same hash",
             "the order of the tokens matters: hash them in order, not as a set, a sum or sorted.")
    blocks = itertools.product(range(3), range(3), range(3), range(4))     # 108 blocks, after 2 parents
    names = {fn(p, list(b)) for b in blocks for p in (None, parent)}
    if len(names) < 2 * 108:
        fail(HASH, "216 different hashes for 216 different (parent, block) pairs", f"{len(names)} different",
             "keep the whole hash (64 bits): a small modulus or a short digest makes different blocks collide.")
    salted = "Python's hash() of a str or bytes is salted per process; use hashlib (e.g. blake2b or sha256)."
    if hashes_text(fn, [(None, block), (parent, block)]):
        fail(HASH, "the same hash in every Python process", "a call of hash() on text", salted)
    stable = stable_across_processes(fn, [(None, block), (parent, block)])
    if stable is False:
        fail(HASH, "the same hash in every Python process", "a different hash in a new process", salted)
    if stable is None:
        fail(HASH, "a function that runs in a fresh Python process", "one that fails there",
             "keep what hash_block needs inside it or in functions and modules it uses, not in other variables.")
    passed(HASH, "Equal names mean equal prefixes: that is what lets two requests share a block.")


# (token_budget, num_decodes, remaining): all fit, one split, a long one in the middle, decodes only, ...
BUDGET_CASES = [(16, 4, [5, 3]), (16, 4, [5, 20, 3]), (16, 4, [20]), (8, 8, [3, 4]), (10, 0, [4, 4, 4]),
                (32, 3, []), (64, 2, [10, 100, 5])]


@grades_quietly
@refuses_references("token budget", budget_prefill_chunks)
def check_budget_chunks(fn) -> None:
    """Check `fn(token_budget, num_decodes, remaining) -> list[int]`: the prompt tokens each waiting
    sequence computes this step (`scheduler.budget_prefill_chunks`). Introduced in notebook 06 (continuous batching)."""
    from ..engine.serving.scheduler import budget_prefill_chunks as reference
    for budget, decodes, remaining in BUDGET_CASES:
        want = reference(budget, decodes, list(remaining))
        case = f"token_budget={budget}, num_decodes={decodes}, remaining={remaining}"
        got = call_learner(BUDGET, want, f"it raised an error. Case: {case}", fn, budget, decodes, list(remaining))
        if not isinstance(got, (list, tuple)) or not all(isinstance(c, numbers.Integral) for c in got):
            fail(BUDGET, f"a list like {want}", repr(got)[:60], f"return one int per waiting sequence. Case: {case}")
        got = [int(c) for c in got]
        if len(got) != len(remaining):
            fail(BUDGET, want, got, f"one chunk per waiting sequence, zeros included, in order. Case: {case}")
        if got == want:
            continue
        if any(c < 0 for c in got):
            hint = "a chunk is never negative: once the budget is spent, the rest get 0."
        elif any(c > r for c, r in zip(got, remaining)):
            hint = "a sequence never computes more than the prompt tokens it has left."
        elif got == reference(budget, 0, remaining):
            hint = "each running sequence's decode costs one token of the budget first; the prompts get the rest."
        elif decodes + sum(got) > budget:
            hint = "the decodes and the prompt chunks together must fit in the budget."
        elif got == _whole_prompts(budget - decodes, remaining, skip=False):
            hint = "a prompt longer than what is left still gets a chunk of what is left: split it across steps."
        elif got == _whole_prompts(budget - decodes, remaining, skip=True):
            hint = ("in order of arrival: a long prompt gets what is left (it is split across steps), "
                    "and later prompts must not jump ahead of it.")
        elif got[1:] == [0] * (len(got) - 1) and want[1:] != got[1:]:
            hint = "what the first prompt leaves of the budget goes to the next prompts, in order."
        else:
            hint = "left = token_budget - num_decodes; then each prompt in order gets min(its remaining, left)."
        fail(BUDGET, want, got, f"{hint} Case: {case}")
    try:
        got = fn(4, 6, [1])
    except Exception:                                # noqa: BLE001 - any error refuses the impossible step
        pass
    else:
        fail(BUDGET, "an error", repr(got)[:60], "6 decodes cannot fit in a budget of 4 tokens: raise an error "
             "(the engine refuses a token_budget below max_slots).")
    passed(BUDGET, "Decodes first, then prompt chunks in order: a long prompt no longer stalls the batch.")


def _whole_prompts(left, remaining, skip):
    """A prompt only whole: stop at the first that does not fit (skip=False) or skip it (skip=True)."""
    chunks, stopped = [], False
    for need in remaining:
        chunks.append(need if need <= left and not stopped else 0)
        left, stopped = left - chunks[-1], stopped or (need > left and not skip)
    return chunks
