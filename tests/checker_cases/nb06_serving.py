"""Checker cases of notebook 06 (continuous batching): the reference and each typical mistake."""

import math
import random

import torch

from labsupport.checks.serving import (check_block_hash, check_blocks_for, check_schedule_step, reference_blocks_for,
                                       reference_schedule_step)
from labsupport.checks.serving_step import check_engine_step
from labsupport.checks.serving_step_reference import reference_engine_step
from labsupport.checks.serving_write import check_paged_write, reference_paged_write
from labsupport.engine.serving import block_hash, budget_prefill_chunks
from labsupport.engine.config import PRESETS

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


# --- one step's keys written into the paged pool ---------------------------------------------

def paged_write(pool_keys, tables, lengths, new_keys, free_blocks, block_size, slip=None):
    """The notebook's solution; `slip` names one typical mistake to make instead."""
    for table, length, keys in zip(tables, lengths, new_keys):
        end = length + len(keys)
        if slip == "one-block-at-most":
            if len(table) * block_size < end:
                table.append(free_blocks.pop())
        elif slip == "ignores-the-room-left":
            for _ in range(-(-len(keys) // block_size)):
                table.append(free_blocks.pop())
        elif slip == "a-block-every-step":
            table.append(free_blocks.pop())
            while len(table) * block_size < end:
                table.append(free_blocks.pop())
        else:
            taken = 0
            while len(table) * block_size < end:
                if slip == "blocks-left-in-the-free-list":
                    taken += 1
                    table.append(free_blocks[-taken])
                elif slip == "a-block-from-outside-the-free-list":
                    table.append(max(b for t in tables for b in t) + 1 if any(tables) else 0)
                elif slip == "never-runs-out":
                    table.append(free_blocks.pop() if free_blocks else 0)
                else:
                    table.append(free_blocks.pop())
        start = {"from-position-0": 0, "one-position-early": length - 1,
                 "one-position-late": length + 1}.get(slip, length)
        positions = torch.arange(start, start + len(keys))
        blocks = torch.as_tensor(table)
        if slip == "logical-block-as-physical":
            slots = positions
        elif slip == "quotient-and-remainder-swapped":
            slots = blocks[positions % block_size] * block_size + positions // block_size
        else:
            slots = blocks[positions // block_size] * block_size + positions % block_size
        if slip == "writes-a-copy":
            pool_keys[slots].copy_(keys)                                 # advanced indexing: a copy
        else:
            pool_keys[slots] = keys


def written_by(slip):
    return lambda *args: paged_write(*args, slip=slip)


def paged_write_by_position(pool_keys, tables, lengths, new_keys, free_blocks, block_size):
    """Another right answer: a loop over positions, blocks taken from the front of the free list."""
    for table, length, keys in zip(tables, lengths, new_keys):
        for j, key in enumerate(keys):
            p = length + j
            if p // block_size == len(table):
                if not free_blocks:
                    raise RuntimeError("out of blocks")
                table.append(free_blocks.pop(0))
            pool_keys[table[p // block_size] * block_size + p % block_size] = key


# --- a block's hash in the prefix cache ----------------------------------------------------

def salted(parent_hash, block_tokens):
    return hash(f"{parent_hash}|{list(block_tokens)}")              # Python's str hash: salted per process


def sorted_tokens(parent_hash, block_tokens):
    return block_hash(parent_hash, sorted(block_tokens))


# --- one whole engine step -----------------------------------------------------------------

def engine_step(state, model, max_slots, token_budget, block_size, slip=None):
    """The notebook's solution; `slip` names one typical mistake to make instead."""
    waiting, running = state["waiting"], state["running"]

    def tokens(seq):
        if slip == "recomputes-the-prompt-only" and seq["computed"] < len(seq["prompt"]):
            return seq["prompt"]
        return seq["prompt"] + seq["output"]

    def left_to_compute(seq):
        return len(tokens(seq)) - seq["computed"]

    def blocks(positions):
        return -(-positions // block_size)

    for seq in list(running):                                            # 1. room for one more position
        if seq not in running:
            continue
        need = max(0, blocks(seq["computed"] + 1) - seq["blocks"])
        if slip == "no-growth":
            need = 0
        while need > state["free_blocks"] and seq in running and slip != "no-preemption":
            victim = running.pop(0) if slip == "oldest-victim" else running.pop()
            state["free_blocks"] += victim["blocks"]
            victim["blocks"] = 0
            if slip != "victim-keeps-its-cache":
                victim["computed"] = 0
            if slip == "victim-to-the-back":
                waiting.append(victim)
            else:
                waiting.insert(0, victim)
        if seq in running:
            seq["blocks"] += need
            state["free_blocks"] -= need
    decodes = [s for s in running if s["output"] and left_to_compute(s) == 1]           # 2. decodes
    prefills = [s for s in running if s not in decodes]
    left = token_budget if slip == "decodes-forgotten" else token_budget - len(decodes)
    queue = list(waiting)                                                # 3. admission
    for seq in queue:
        need = blocks(len(tokens(seq)) + (0 if slip == "no-block-for-the-first-decode" else 1))
        in_step = sum(map(left_to_compute, prefills))
        if slip != "beyond-max-slots" and len(running) >= max_slots:
            break
        if slip == "whole-prompt-must-fit" and in_step + left_to_compute(seq) > left:
            break
        if slip != "admits-beyond-the-budget" and in_step >= left:
            break
        if need > state["free_blocks"]:
            if slip == "jumps-the-queue":
                continue
            break
        waiting.remove(seq)
        seq["blocks"] += need
        state["free_blocks"] -= need
        running.append(seq)
        if slip == "newcomers-first":
            prefills.insert(0, seq)
        else:
            prefills.append(seq)
    rows = [(s, 1) for s in decodes]                                     # 4. chunks
    for seq in prefills:
        chunk = left_to_compute(seq) if slip == "no-split" else min(left_to_compute(seq), left)
        if slip == "whole-prompts-only" and chunk < left_to_compute(seq):
            chunk = 0
        left -= chunk
        if chunk:
            rows.append((seq, chunk))
    if not rows:
        return
    def row(s, n):                                                       # 5. one forward pass
        if slip == "the-last-tokens":
            return s["id"], tokens(s)[-n:]
        return s["id"], tokens(s)[s["computed"]: s["computed"] + n]
    if slip == "a-call-per-row":
        next_tokens = [model([row(s, n)])[0] for s, n in rows]
    else:
        next_tokens = model([row(s, n) for s, n in rows])
    for (seq, n), token in zip(rows, next_tokens):                       # 6. tokens and finishing
        seq["computed"] += n
        if seq["computed"] == len(tokens(seq)) or slip == "a-token-per-chunk":
            seq["output"].append(token)
            if len(seq["output"]) >= seq["max_new_tokens"] and slip != "finished-keep-running":
                running.remove(seq)
                if slip != "blocks-not-freed":
                    state["free_blocks"] += seq["blocks"]
                seq["blocks"] = 0


def stepped_by(slip):
    return lambda *args: engine_step(*args, slip=slip)


def chunks_from_the_package(state, model, max_slots, token_budget, block_size):
    """The right step, with the chunks from the package's budget_prefill_chunks."""
    budget_prefill_chunks(token_budget, 0, [])
    engine_step(state, model, max_slots, token_budget, block_size)


def does_nothing(state, model, max_slots, token_budget, block_size):
    return None


def copies_the_sequences(state, model, max_slots, token_budget, block_size):
    """The right step, then the queue rebuilt from copies of the sequences' dicts."""
    engine_step(state, model, max_slots, token_budget, block_size)
    state["waiting"] = [dict(seq) for seq in state["waiting"]]


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
    accepts(check_paged_write, "reference", paged_write),
    accepts(check_paged_write, "reference-smollm-shapes", paged_write, PRESETS["smollm2-135m"]),
    accepts(check_paged_write, "a-loop-over-positions-from-the-front-of-the-free-list", paged_write_by_position),
    refuses(check_paged_write, "the-packages-own-answer", "write the steps yourself", reference_paged_write),
    refuses(check_paged_write, "a-call-of-the-packages-answer", "write the steps yourself",
            lambda *args: reference_paged_write(*args)),
    refuses(check_paged_write, "one-block-at-most", "more than one block", written_by("one-block-at-most")),
    refuses(check_paged_write, "ignores-the-room-left", "still has room", written_by("ignores-the-room-left")),
    refuses(check_paged_write, "a-block-every-step", "still has room", written_by("a-block-every-step")),
    refuses(check_paged_write, "blocks-left-in-the-free-list", "take each new block out of free_blocks",
            written_by("blocks-left-in-the-free-list")),
    refuses(check_paged_write, "never-runs-out", "raise an error", written_by("never-runs-out")),
    refuses(check_paged_write, "writes-a-copy", "in place", written_by("writes-a-copy")),
    refuses(check_paged_write, "from-position-0", "start again at position 0", written_by("from-position-0")),
    refuses(check_paged_write, "one-position-early", r"one position\s+early", written_by("one-position-early")),
    refuses(check_paged_write, "logical-block-as-physical", "logical block index",
            written_by("logical-block-as-physical")),
    refuses(check_paged_write, "one-position-late", "before its keys go to the slots", written_by("one-position-late")),
    refuses(check_paged_write, "quotient-and-remainder-swapped", "before its keys go to the slots",
            written_by("quotient-and-remainder-swapped")),
    refuses(check_paged_write, "a-block-from-outside-the-free-list", "must come from free_blocks",
            written_by("a-block-from-outside-the-free-list")),
    accepts(check_engine_step, "reference", engine_step),
    refuses(check_engine_step, "the-packages-own-answer", "write the steps yourself", reference_engine_step),
    refuses(check_engine_step, "a-call-of-the-packages-answer", "write the steps yourself",
            lambda *args: reference_engine_step(*args)),
    refuses(check_engine_step, "chunks-from-budget_prefill_chunks", "write the steps yourself",
            chunks_from_the_package),
    refuses(check_engine_step, "does-nothing", "admit from the front of the queue", does_nothing),
    refuses(check_engine_step, "decodes-forgotten", "each decode costs one token", stepped_by("decodes-forgotten")),
    refuses(check_engine_step, "no-split", "at most token_budget", stepped_by("no-split")),
    refuses(check_engine_step, "whole-prompts-only", "split a long prompt", stepped_by("whole-prompts-only")),
    refuses(check_engine_step, "whole-prompt-must-fit", "only one token of the budget",
            stepped_by("whole-prompt-must-fit")),
    refuses(check_engine_step, "admits-beyond-the-budget", "a token for it", stepped_by("admits-beyond-the-budget")),
    refuses(check_engine_step, "jumps-the-queue", "jump ahead", stepped_by("jumps-the-queue")),
    refuses(check_engine_step, "beyond-max-slots", "max_slots = 3", stepped_by("beyond-max-slots")),
    refuses(check_engine_step, "no-block-for-the-first-decode", "len\\(tokens\\) \\+ 1 positions",
            stepped_by("no-block-for-the-first-decode")),
    refuses(check_engine_step, "newcomers-first", "in order of admission", stepped_by("newcomers-first")),
    refuses(check_engine_step, "no-growth", "takes one from free_blocks", stepped_by("no-growth")),
    refuses(check_engine_step, "no-preemption", "preempt the most recently admitted", stepped_by("no-preemption")),
    refuses(check_engine_step, "oldest-victim", "the victim is the most recently admitted",
            stepped_by("oldest-victim")),
    refuses(check_engine_step, "victim-to-the-back", "front of the queue", stepped_by("victim-to-the-back")),
    refuses(check_engine_step, "victim-keeps-its-cache", "loses its cache", stepped_by("victim-keeps-its-cache")),
    refuses(check_engine_step, "recomputes-the-prompt-only", "its output too",
            stepped_by("recomputes-the-prompt-only")),
    refuses(check_engine_step, "the-last-tokens", "not computed yet", stepped_by("the-last-tokens")),
    refuses(check_engine_step, "a-call-per-row", "one forward pass per step", stepped_by("a-call-per-row")),
    refuses(check_engine_step, "a-token-per-chunk", "part-way through the prompt", stepped_by("a-token-per-chunk")),
    refuses(check_engine_step, "finished-keep-running", "has finished", stepped_by("finished-keep-running")),
    refuses(check_engine_step, "blocks-not-freed", "blocks go back", stepped_by("blocks-not-freed")),
    refuses(check_engine_step, "copies-the-sequences", "dicts themselves", copies_the_sequences),
]
