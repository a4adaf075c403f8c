"""Checker cases of notebook 06 (continuous batching): the reference and each typical mistake."""

import math
import random

import torch

from labsupport.checks.serving import (check_block_hash, check_blocks_for, check_budget_chunks,
                                       check_paged_gather, check_schedule_step, reference_blocks_for,
                                       reference_paged_gather, reference_schedule_step)
from labsupport.engine.serving import block_hash, budget_prefill_chunks
from labsupport.engine.models.config import PRESETS

from checker_cases.common import accepts, refuses


# --- notebook 06 (continuous batching): one scheduler step ---------------------------------

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


def finished_stay(running, waiting, max_slots, free_blocks, policy):
    _, joining = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    return [], joining                                               # nobody ever leaves


def static_never_leaves(running, waiting, max_slots, free_blocks, policy):
    if policy == "static":
        return [], reference_schedule_step(running, waiting, max_slots, free_blocks, policy)[1]
    return reference_schedule_step(running, waiting, max_slots, free_blocks, policy)


def finished_keep_slots(running, waiting, max_slots, free_blocks, policy):
    if policy == "static":
        return reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    leaving = [sid for sid, done in running if done]
    slots, joining = max_slots - len(running), []                    # the finished still count
    for sid, need in waiting:
        if slots == 0 or need > free_blocks:
            break
        joining.append(sid)
        slots, free_blocks = slots - 1, free_blocks - need
    return leaving, joining


# --- a sequence's keys gathered from the paged pool ------------------------------------------

def reads(slots_of):
    """A gather that reads the slots `slots_of(positions, table, block_size)` gives."""
    def gather(pool_keys, table, length, block_size):
        positions = torch.arange(length)
        return pool_keys[slots_of(positions, torch.tensor(table), block_size)]
    return gather


def whole_blocks(pool_keys, table, length, block_size):
    slots = (torch.tensor(table)[:, None] * block_size + torch.arange(block_size)).flatten()  # (blocks * b,)
    return pool_keys[slots]


# --- a block's hash in the prefix cache ----------------------------------------------------

def salted(parent_hash, block_tokens):
    return hash(f"{parent_hash}|{list(block_tokens)}")              # Python's str hash: salted per process


def sorted_tokens(parent_hash, block_tokens):
    return block_hash(parent_hash, sorted(block_tokens))


# --- a scheduler step under a token budget -------------------------------------------------

def goes_negative(token_budget, num_decodes, remaining):
    left, chunks = token_budget - num_decodes, []
    for need in remaining:
        chunks.append(min(need, left))
        left -= need                                                 # subtracts the whole prompt
    return chunks


def whole_prompts_only(token_budget, num_decodes, remaining, skip=False):
    left, chunks, stopped = token_budget - num_decodes, [], False
    for need in remaining:
        fits = need <= left and not stopped
        chunks.append(need if fits else 0)
        left -= chunks[-1]
        stopped = stopped or (not fits and not skip)
    return chunks


def first_only(token_budget, num_decodes, remaining):
    return [min(remaining[0], token_budget - num_decodes)] + [0] * (len(remaining) - 1) if remaining else []


def reference_chunks(token_budget, num_decodes, remaining):      # the notebook's solution
    left = token_budget - num_decodes
    if left < 0:
        raise ValueError(f"{num_decodes} decodes do not fit in a budget of {token_budget} tokens")
    chunks = []
    for need in remaining:
        chunks.append(min(need, left))
        left -= chunks[-1]
    return chunks


def never_refuses(token_budget, num_decodes, remaining):
    return [0] * len(remaining) if num_decodes > token_budget else reference_chunks(token_budget, num_decodes,
                                                                                          remaining)


NOTEBOOK_06 = [
    accepts(check_schedule_step, "reference", reference_schedule_step),
    refuses(check_schedule_step, "too-many-join", "only \\d+ slots are free", too_many),
    refuses(check_schedule_step, "jumps-the-queue", "jump the queue", jumps_queue),
    refuses(check_schedule_step, "static-refills", "keeps its slot", static_refills),
    refuses(check_schedule_step, "blocks-ignored", "free blocks", no_blocks),
    refuses(check_schedule_step, "finished-stay", "finished leave", finished_stay),
    refuses(check_schedule_step, "static-never-leaves", "whole batch leaves together", static_never_leaves),
    refuses(check_schedule_step, "finished-keep-their-slots", "frees its slot at once", finished_keep_slots),
    refuses(check_schedule_step, "no-pair", "pair", lambda *a: None),
    accepts(check_blocks_for, "reference", reference_blocks_for),
    refuses(check_blocks_for, "ceiling-of-the-total", "round up for each sequence",
            lambda lengths, b: math.ceil(sum(lengths) / b)),
    refuses(check_blocks_for, "rounds-down", "round up, not down", lambda lengths, b: sum(n // b for n in lengths)),
    refuses(check_blocks_for, "one-block-too-many", "exact multiple",
            lambda lengths, b: sum(n // b + 1 for n in lengths)),
    refuses(check_blocks_for, "reserves-the-longest", "not for the longest",
            lambda lengths, b: len(lengths) * math.ceil(max(lengths, default=0) / b)),
    refuses(check_blocks_for, "positions", "counts positions", lambda lengths, b: sum(lengths)),
    refuses(check_blocks_for, "fractions", "fraction of a block", lambda lengths, b: sum(n / b for n in lengths)),
    refuses(check_blocks_for, "text", "integer", lambda lengths, b: "many"),
    accepts(check_paged_gather, "reference", reference_paged_gather),
    accepts(check_paged_gather, "reference-smollm-shapes", reference_paged_gather, PRESETS["smollm2-135m"]),
    refuses(check_paged_gather, "logical-block-as-physical", "logical block index", reads(lambda p, t, b: p)),
    refuses(check_paged_gather, "offset-one-too-far", "one position too far",
            reads(lambda p, t, b: t[p // b] * b + p % b + 1)),
    refuses(check_paged_gather, "offset-one-short", "one position short",
            reads(lambda p, t, b: t[p // b] * b + p % b - 1)),
    refuses(check_paged_gather, "blocks-from-one", "count from 0", reads(lambda p, t, b: (t[p // b] + 1) * b + p % b)),
    refuses(check_paged_gather, "quotient-and-remainder-swapped", "block_table\\[p // block_size\\] \\* block_size",
            reads(lambda p, t, b: t[p % b] * b + p // b)),
    refuses(check_paged_gather, "whole-last-block", "only partly filled", whole_blocks),
    refuses(check_paged_gather, "partial-last-block-left-out", "left out the partly filled last block",
            lambda pool, t, n, b: reference_paged_gather(pool, t, (n // b) * b, b)),
    refuses(check_paged_gather, "heads-first", "positions come first",
            lambda pool, t, n, b: reference_paged_gather(pool, t, n, b).transpose(0, 1)),
    refuses(check_paged_gather, "a-list", "one tensor", lambda pool, t, n, b: reference_paged_gather(pool, t, n, b).tolist()),
    accepts(check_block_hash, "reference", block_hash),
    refuses(check_block_hash, "ignores-the-parent", "mix the parent", lambda p, t: block_hash(None, t)),
    refuses(check_block_hash, "only-the-last-token", "not only the last", lambda p, t: block_hash(p, list(t)[-1:])),
    refuses(check_block_hash, "only-the-first-token", "not only the last \\(or the first\\)",
            lambda p, t: block_hash(p, list(t)[:1])),
    refuses(check_block_hash, "order-ignored", "order of the tokens matters", sorted_tokens),
    refuses(check_block_hash, "a-sum", "order of the tokens matters", lambda p, t: hash((p, sum(t)))),
    refuses(check_block_hash, "random", "same hash on every call", lambda p, t: random.getrandbits(64)),
    refuses(check_block_hash, "salted-str-hash", "salted per process", salted),
    refuses(check_block_hash, "small-modulus", "collide", lambda p, t: block_hash(p, t) % 97),
    refuses(check_block_hash, "a-string", "return an int", lambda p, t: str(block_hash(p, t))),
    accepts(check_budget_chunks, "reference", reference_chunks),
    refuses(check_budget_chunks, "the-packages-own-function", "write the steps yourself", budget_prefill_chunks),
    refuses(check_budget_chunks, "the-packages-own-answer", "write the steps yourself",
            lambda b, d, r: budget_prefill_chunks(b, d, r)),
    refuses(check_budget_chunks, "forgets-the-decodes", "decode costs one token",
            lambda b, d, r: reference_chunks(b, 0, r)),
    refuses(check_budget_chunks, "no-split", "split it across steps", whole_prompts_only),
    refuses(check_budget_chunks, "skips-a-long-one", "must not jump ahead",
            lambda b, d, r: whole_prompts_only(b, d, r, skip=True)),
    refuses(check_budget_chunks, "first-only", "goes to the next prompts", first_only),
    refuses(check_budget_chunks, "exceeds-the-budget", "must fit in the budget", lambda b, d, r: list(r)),
    refuses(check_budget_chunks, "negative-chunks", "never negative", goes_negative),
    refuses(check_budget_chunks, "zeros-left-out", "zeros included",
            lambda b, d, r: [c for c in reference_chunks(b, d, r) if c]),
    refuses(check_budget_chunks, "a-total", "one int per waiting sequence",
            lambda b, d, r: sum(reference_chunks(b, d, r))),
    refuses(check_budget_chunks, "never-refuses", "raise an error", never_refuses),
]
