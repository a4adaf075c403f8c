"""Checkers for notebook 06 (continuous batching): one scheduler step, and the blocks
a set of sequences needs.

Introduced in notebook 06 (continuous batching). Each checker compares a learner's
function with the reference on a handful of cases and prints a short confirmation
or raises `CheckFailed` with what was expected, what came back and a hint.
"""

from __future__ import annotations

from ..serving.block_manager import blocks_needed
from . import fail, passed

STEP = "one scheduler step"
BLOCKS = "blocks for a set of sequences"


def reference_schedule_step(running, waiting, max_slots, free_blocks, policy="continuous"):
    """Who leaves the batch and who joins it before the next step.

    Introduced in notebook 06 (continuous batching).
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


def check_blocks_for(fn) -> None:
    """Check `fn(lengths, block_size) -> int`: the sum over sequences of ceil(length / block_size).

    Introduced in notebook 06 (continuous batching)."""
    cases = [([17, 16, 1], 16), ([5, 5, 5, 5], 4), ([100], 16), ([], 16), ([1, 2, 3], 1), ([33, 47, 8, 64], 16),
             ([15, 15], 16)]
    for lengths, block_size in cases:
        want = reference_blocks_for(lengths, block_size)
        try:
            got = int(fn(list(lengths), block_size))
        except (TypeError, ValueError) as error:
            fail(BLOCKS, "an integer", f"an error: {error}", "return the number of blocks as an int")
        if got == want:
            continue
        total = sum(lengths)
        if got == -(-total // block_size):
            hint = ("blocks are not shared between sequences: round up for each sequence on its own, "
                    "then add; the ceiling of the total undercounts the partly filled last blocks.")
        elif got == sum(n // block_size for n in lengths):
            hint = "a sequence with a partly filled last block still needs that block: round up, not down."
        elif got == total // block_size:
            hint = "round up per sequence: ceil(length / block_size) for each, then add."
        else:
            hint = "sum over the sequences of ceil(length / block_size), e.g. -(-length // block_size)."
        fail(BLOCKS, f"{want} for lengths {lengths}, block_size {block_size}", got, hint)
    passed(BLOCKS, "Each sequence wastes less than one block: at most block_size - 1 positions.")
