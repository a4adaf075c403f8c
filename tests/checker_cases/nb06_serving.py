"""Checker cases of notebook 06 (continuous batching): the reference and each typical mistake."""

import math

from labsupport.checks.serving import (check_blocks_for, check_schedule_step, reference_blocks_for,
                                       reference_schedule_step)

from checker_cases.common import accepts, refuses


# --- notebook 06 (continuous batching) ----------------------------------------------------

def too_many(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    if policy == "static" and len(leaving) < len(running):
        return [], []
    return leaving, [sid for sid, _ in waiting][:max_slots]          # ignores the ones that stay


def jumps_queue(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    if policy == "static" and len(leaving) < len(running):
        return [], []
    slots = max_slots - (len(running) - len(leaving) if policy == "continuous" else 0)
    joining = []
    for sid, need in waiting:                                        # skips what does not fit
        if len(joining) < slots and need <= free_blocks:
            joining.append(sid)
            free_blocks -= need
    return leaving, joining


def static_refills(running, waiting, max_slots, free_blocks, policy):
    return reference_schedule_step(running, waiting, max_slots, free_blocks, "continuous")


def no_blocks(running, waiting, max_slots, free_blocks, policy):
    return reference_schedule_step(running, waiting, max_slots, 10**9, policy)


NOTEBOOK_06 = [
    accepts(check_schedule_step, "reference", reference_schedule_step),
    refuses(check_schedule_step, "too-many-join", "only \\d+ slots are free", too_many),
    refuses(check_schedule_step, "jumps-the-queue", "jump the queue", jumps_queue),
    refuses(check_schedule_step, "static-refills", "keeps its slot", static_refills),
    refuses(check_schedule_step, "blocks-ignored", "free blocks", no_blocks),
    refuses(check_schedule_step, "no-pair", "pair", lambda *a: None),
    accepts(check_blocks_for, "reference", reference_blocks_for),
    refuses(check_blocks_for, "ceiling-of-the-total", "round up for each sequence",
            lambda lengths, b: math.ceil(sum(lengths) / b)),
    refuses(check_blocks_for, "rounds-down", "round up, not down", lambda lengths, b: sum(n // b for n in lengths)),
    refuses(check_blocks_for, "one-block-too-many", "ceil", lambda lengths, b: sum(n // b + 1 for n in lengths)),
    refuses(check_blocks_for, "text", "integer", lambda lengths, b: "many"),
]
