"""Checkers for notebook 06 (continuous batching): one scheduler step, the blocks a set of
sequences needs and a block's hash in the prefix cache (exercises 1, 2 and 5); one step's keys
written into the paged pool is checked in `serving_write`, the whole engine step in
`serving_step`. Each compares a learner's function with the reference and prints a short
confirmation or raises `CheckFailed` with a hint.
"""

from __future__ import annotations

import itertools
import numbers

from ..engine.serving.block_manager import blocks_needed
from .grading import Exercise, graded
from .serving_processes import hashes_text, stable_across_processes
from . import call_learner, fail, grades_quietly, passed

STEP = "one scheduler step"
BLOCKS = "blocks for a set of sequences"
SERVING = "labsupport.engine.serving."
SCHEDULER = SERVING + "scheduler."


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
@graded(Exercise(
    title=STEP, teaches="the scheduler's choice of who leaves the batch and who joins it before the next step",
    computed_by=(SCHEDULER + "Scheduler", SCHEDULER + "Scheduler.schedule", SCHEDULER + "StaticBatching",
                 SCHEDULER + "StaticBatching.decide", SCHEDULER + "ContinuousBatching",
                 SCHEDULER + "ContinuousBatching.decide", SCHEDULER + "as_policy")))
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
@graded(Exercise(
    title=BLOCKS, teaches="the blocks a set of sequences holds in a paged cache, each rounded up on its own",
    computed_by=(SERVING + "block_manager.blocks_needed", SERVING + "block_manager.BlockManager",
                 SERVING + "block_manager.BlockManager.grow", SERVING + "block_manager.BlockManager.extra_blocks")))
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


# --- a block's name in the prefix cache -------------------------------------------------------------

HASH = "the hash of a block and its prefix"
LARGE_IDS = [300, 12, 70_000, 151_000]          # token ids of a real vocabulary: far above 255 (one byte)


def _bytes_hint(error) -> str:
    if isinstance(error, ValueError) and "range(0, 256)" in str(error):
        return ("bytes(ids) holds only values below 256, and token ids go up to the vocabulary's size (tens of "
                "thousands): write each id in full, e.g. as text, or with int(t).to_bytes(8, 'little').")
    return (f"your function raised an error on fn(None, {LARGE_IDS}): token ids go up to the vocabulary's size "
            "(151,000 here): give each id enough bytes (4 or 8), or write it as text.")


def _check_hash_values(fn, block, got, parent) -> None:
    """Same tokens, same name; any change of a token, of their order or of the prefix, another name."""
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
    large = call_learner(HASH, "an integer for token ids of 256 and more", _bytes_hint, fn, None, list(LARGE_IDS))
    wrapped = [fn(None, [11 + shift, 12, 13, 14]) for shift in (256, 2**16)]
    if got in wrapped or len({large, *wrapped}) < 3:
        fail(HASH, "different hashes for the token ids 11, 267 and 65547 in the same place", "the same hash",
             "keep every bit of each token id: one or two bytes per id (an id modulo 256 or 65536) let different "
             "tokens share a name.")


def _check_hash_width(fn, parent) -> None:
    """216 different (parent, block) pairs get 216 names, and the names use all 64 bits."""
    blocks = itertools.product(range(3), range(3), range(3), range(4))     # 108 blocks, after 2 parents
    names = {fn(p, list(b)) for b in blocks for p in (None, parent)}
    if len(names) < 2 * 108:
        fail(HASH, "216 different hashes for 216 different (parent, block) pairs", f"{len(names)} different",
             "keep the whole hash (64 bits): a small modulus or a short digest makes different blocks collide.")
    bits = max(abs(int(n)) for n in names).bit_length()
    if bits < 63:
        fail(HASH, "a 64-bit hash (over 216 blocks, some name beyond 2**62)", f"names of at most {bits} bits",
             "a 32-bit checksum such as zlib.crc32, or a digest shorter than 8 bytes, gives different prefixes "
             "the same name far sooner: keep all 8 bytes, e.g. int.from_bytes(hashlib.blake2b(data, digest_size=8)"
             ".digest(), 'little').")


@grades_quietly
@graded(Exercise(
    title=HASH,
    teaches="a full block's name in the prefix cache: a stable 64-bit hash of its tokens and its parent's name",
    computed_by=(SERVING + "prefix_cache.block_hash", SERVING + "prefix_cache.prefix_block_hashes",
                 SERVING + "prefix_cache.PrefixCache", SERVING + "prefix_cache.PrefixCache.insert",
                 SERVING + "block_manager.BlockManager", SERVING + "block_manager.BlockManager.cache_full_blocks")))
def check_block_hash(fn) -> None:
    """Check `fn(parent_hash, block_tokens) -> int`, a block's name in the prefix cache: a 64-bit
    integer that depends on every token (ids of any size), their order and the parent's hash, the
    same on every call and in every process. Introduced in notebook 06b (chunked prefill and prefix caching).

    The last check runs `fn` (with the helpers it calls) in two fresh Pythons of different hash
    seeds; a call of the built-in hash() on text, even inside a helper, is refused before it."""
    block = [11, 12, 13, 14]
    got = call_learner(HASH, "an integer", "your function raised an error on fn(None, [11, 12, 13, 14]).",
                       fn, None, list(block))
    if isinstance(got, bool) or not isinstance(got, numbers.Integral) or not -2**63 <= got < 2**64:
        fail(HASH, "an integer of at most 64 bits", repr(got)[:60],
             "return an int, e.g. int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), 'little').")
    parent = fn(None, [1, 2, 3, 4])
    _check_hash_values(fn, block, got, parent)
    _check_hash_width(fn, parent)
    salted = "Python's hash() of a str or bytes is salted per process; use hashlib (e.g. blake2b or sha256)."
    if hashes_text(fn, [(None, block), (parent, block)]):
        fail(HASH, "the same hash in every Python process", "a call of hash() on text", salted)
    stable = stable_across_processes(fn, [(None, block), (parent, block), (None, LARGE_IDS)])
    if stable is False:
        fail(HASH, "the same hash in every Python process", "a different hash in a new process", salted)
    if stable is None:
        fail(HASH, "a function that runs in a fresh Python process", "one that fails there",
             "keep what hash_block needs inside it or in functions and modules it uses, not in other variables.")
    passed(HASH, "Equal names mean equal prefixes: that is what lets two requests share a block.")
