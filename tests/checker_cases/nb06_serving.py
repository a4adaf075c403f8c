"""Checker cases of notebook 06 (continuous batching) and 06b (chunked prefill and prefix caching): the
notebook's solutions (written out here: no row's answer calls the package), each typical mistake, and the
package's own answers, however a learner's function holds them (all refused)."""

import hashlib
import math
import random
import types
import zlib

import torch

from labsupport.checks.serving import (check_block_hash, check_blocks_for, check_schedule_step, reference_blocks_for,
                                       reference_schedule_step)
from labsupport.checks.serving_step import check_engine_step
from labsupport.checks.serving_step_reference import package_steps, reference_engine_step
from labsupport.checks.serving_write import _slots, check_paged_write, reference_paged_write
from labsupport.engine.serving import (BlockManager, PagedKVCache, PrefixCache, Request, Scheduler, ServedSequence,
                                       block_hash, blocks_needed, budget_prefill_chunks)
from labsupport.engine.serving.prefix_cache import prefix_block_hashes
from labsupport.engine.config import PRESETS

from checker_cases.common import accepts, refuses

OWN_CODE = "expected your own code"


def held(target):
    """Three learner's functions that hold the package's `target`: as a default argument, in a closure, and
    through a helper of their own."""
    def by_default(*args, _answer=target):
        return _answer(*args)

    def closure():
        answer = target
        return lambda *args: answer(*args)

    def helper(*args):
        return by_default(*args)
    return {"as-a-default-argument": by_default, "in-a-closure": closure(), "through-a-helper": helper}


def refuses_held(checker, name, target, *more):
    """One refusal row per way of holding the package's `target`."""
    return [refuses(checker, f"{name}-{how}", OWN_CODE, fn, *more) for how, fn in held(target).items()]


# --- notebook 06 (continuous batching): one scheduler step ---------------------------------

def schedule_step(running, waiting, max_slots, free_blocks, policy="continuous"):
    """The notebook's solution."""
    finished = [sid for sid, done in running if done]
    if policy == "static" and len(finished) < len(running):
        return [], []
    staying = len(running) - len(finished)
    joining, slots = [], max_slots - staying
    for sid, need in waiting:
        if slots == 0 or need > free_blocks:
            break
        joining.append(sid)
        slots -= 1
        free_blocks -= need
    return finished, joining


def too_many(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = schedule_step(running, waiting, max_slots, free_blocks, policy)
    if policy == "static" and len(leaving) < len(running):
        return [], []
    return leaving, [sid for sid, _ in waiting][:max_slots]          # ignores the ones that stay


def jumps_queue(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = schedule_step(running, waiting, max_slots, free_blocks, policy)
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
    return schedule_step(running, waiting, max_slots, free_blocks, "continuous")


def no_blocks(running, waiting, max_slots, free_blocks, policy):
    return schedule_step(running, waiting, max_slots, 10**9, policy)


def finished_stay(running, waiting, max_slots, free_blocks, policy):
    _, joining = schedule_step(running, waiting, max_slots, free_blocks, policy)
    return [], joining                                               # nobody ever leaves


def static_never_leaves(running, waiting, max_slots, free_blocks, policy):
    if policy == "static":
        return [], schedule_step(running, waiting, max_slots, free_blocks, policy)[1]
    return schedule_step(running, waiting, max_slots, free_blocks, policy)


def finished_keep_slots(running, waiting, max_slots, free_blocks, policy):
    if policy == "static":
        return schedule_step(running, waiting, max_slots, free_blocks, policy)
    leaving = [sid for sid, done in running if done]
    slots, joining = max_slots - len(running), []                    # the finished still count
    for sid, need in waiting:
        if slots == 0 or need > free_blocks:
            break
        joining.append(sid)
        slots, free_blocks = slots - 1, free_blocks - need
    return leaving, joining


def by_the_engines_scheduler(running, waiting, max_slots, free_blocks, policy="continuous"):
    """The engine's own Scheduler takes the decision (refused before it runs: it computes the step)."""
    scheduler = Scheduler(policy, max_slots, BlockManager(max(free_blocks, 1), 1))
    for i, (sid, need) in enumerate(waiting):
        scheduler.add(ServedSequence(Request([1] * need, max_new_tokens=1, request_id=sid), i, "cpu"))
    return [sid for sid, done in running if done], [s.id for s in scheduler.schedule(0).prefill]


# --- blocks for a set of sequences ----------------------------------------------------------

def blocks_for(lengths, block_size):
    """The notebook's solution."""
    return sum(-(-n // block_size) for n in lengths)


def by_the_block_manager(lengths, block_size):
    """The engine's BlockManager hands out the blocks and counts them (refused: it computes the count)."""
    manager = BlockManager(num_blocks=sum(lengths) + 1, block_size=block_size)
    for i, n in enumerate(lengths):
        manager.grow(i, n)
    return manager.num_used


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

def hash_block(parent_hash, block_tokens):
    """The notebook's solution."""
    text = f"{parent_hash}|{','.join(str(int(t)) for t in block_tokens)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def salted(parent_hash, block_tokens):
    return hash(f"{parent_hash}|{list(block_tokens)}")              # Python's str hash: salted per process


def sorted_tokens(parent_hash, block_tokens):
    return hash_block(parent_hash, sorted(block_tokens))


def crc32(parent_hash, block_tokens):
    """Right in every way but its width: a 32-bit checksum."""
    return zlib.crc32(f"{parent_hash}|{list(block_tokens)}".encode())


def digest_of(data: bytes, size: int = 8) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=size).digest(), "little")


def seven_bytes(parent_hash, block_tokens):
    return digest_of(f"{parent_hash}|{list(block_tokens)}".encode(), size=7)


def token_bytes(parent_hash, block_tokens):
    """The ids as bytes(ids): one byte each, which no id of 256 or more fits."""
    return digest_of(str(parent_hash).encode() + b"|" + bytes(block_tokens))


def token_bytes_wrapped(parent_hash, block_tokens):
    """One byte per id, each id modulo 256: ids 11 and 267 read the same."""
    return digest_of(str(parent_hash).encode() + b"|" + bytes(t % 256 for t in block_tokens))


def two_bytes_wrapped(parent_hash, block_tokens):
    """Two bytes per id, each id modulo 65536."""
    return digest_of(str(parent_hash).encode() + b"|" + b"".join((t % 65536).to_bytes(2, "little")
                                                                 for t in block_tokens))


def by_the_prefix_hashes(parent_hash, block_tokens):
    """The engine's chained hashes of a prompt's full blocks (refused: it computes the names)."""
    assert parent_hash is None or parent_hash >= 0
    return prefix_block_hashes(list(block_tokens), len(block_tokens))[-1]


def by_the_prefix_cache(parent_hash, block_tokens):
    """The engine's PrefixCache names the block when it caches it (refused: it computes the name)."""
    cache = PrefixCache(len(block_tokens))
    cache.insert(list(block_tokens), [0])
    return cache.hash_of[0]


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
    if slip == "an-output-means-a-decode":
        decodes = [s for s in running if s["output"]]
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


def slots_of_the_paged_cache(pool_keys, tables, lengths, new_keys, free_blocks, block_size):
    """Right, with the slots from the engine's PagedKVCache.slots (refused: it computes the write's slots)."""
    for table, length, keys in zip(tables, lengths, new_keys):
        while len(table) * block_size < length + len(keys):
            table.append(free_blocks.pop())
        positions = torch.arange(length, length + len(keys))[None]
        cache = types.SimpleNamespace(block_size=block_size)
        pool_keys[PagedKVCache.slots(cache, torch.tensor([table]), positions)[0]] = keys


def slots_of_the_checker(pool_keys, tables, lengths, new_keys, free_blocks, block_size):
    """Right, with the slots from the checker's own helper (refused: the checker's code is not yours)."""
    for table, length, keys in zip(tables, lengths, new_keys):
        while len(table) * block_size < length + len(keys):
            table.append(free_blocks.pop())
    pool_keys[_slots(tables, lengths, [len(k) for k in new_keys], block_size)] = torch.cat(list(new_keys))


def tables_of_the_block_manager(pool_keys, tables, lengths, new_keys, free_blocks, block_size):
    """The tables grown by the engine's BlockManager (refused: it computes the growth)."""
    manager = BlockManager(len(free_blocks) + sum(map(len, tables)), block_size)
    for i, (length, keys) in enumerate(zip(lengths, new_keys)):
        manager.grow(i, length + len(keys))
    paged_write(pool_keys, tables, lengths, new_keys, free_blocks, block_size)


def steps_of_the_engines_scheduler(state, model, max_slots, token_budget, block_size):
    """The engine's own Scheduler plans the step (refused before it runs: it computes the step)."""
    scheduler = Scheduler("continuous", max_slots, BlockManager(state["free_blocks"], block_size), token_budget)
    scheduler.schedule(0)
    engine_step(state, model, max_slots, token_budget, block_size)


def steps_of_the_checker(state, model, max_slots, token_budget, block_size):
    """The checker's own drive of the package's scheduler (refused: the checker's code is not yours)."""
    package_steps({"num_blocks": state["free_blocks"], "block_size": block_size, "max_slots": max_slots,
                   "token_budget": token_budget, "requests": []})
    engine_step(state, model, max_slots, token_budget, block_size)


NOTEBOOK_06 = [
    accepts(check_schedule_step, "the-notebooks-solution", schedule_step),
    refuses(check_schedule_step, "the-checkers-reference", OWN_CODE, reference_schedule_step),
    *refuses_held(check_schedule_step, "the-checkers-reference", reference_schedule_step),
    refuses(check_schedule_step, "the-engines-scheduler", "Scheduler", by_the_engines_scheduler),
    refuses(check_schedule_step, "too-many-join", "only \\d+ slots are free", too_many),
    refuses(check_schedule_step, "jumps-the-queue", "jump the queue", jumps_queue),
    refuses(check_schedule_step, "static-refills", "keeps its slot", static_refills),
    refuses(check_schedule_step, "blocks-ignored", "free blocks", no_blocks),
    refuses(check_schedule_step, "finished-stay", "finished leave", finished_stay),
    refuses(check_schedule_step, "static-never-leaves", "whole batch leaves together", static_never_leaves),
    refuses(check_schedule_step, "finished-keep-their-slots", "frees its slot at once", finished_keep_slots),
    refuses(check_schedule_step, "no-pair", "pair", lambda *a: None),
    accepts(check_blocks_for, "the-notebooks-solution", blocks_for),
    refuses(check_blocks_for, "the-engines-blocks_needed", "blocks_needed",
            lambda lengths, b: sum(blocks_needed(n, b) for n in lengths)),
    *refuses_held(check_blocks_for, "the-engines-blocks_needed",
                  lambda lengths, b: sum(blocks_needed(n, b) for n in lengths)),
    refuses(check_blocks_for, "the-checkers-reference", OWN_CODE, reference_blocks_for),
    *refuses_held(check_blocks_for, "the-checkers-reference", reference_blocks_for),
    refuses(check_blocks_for, "the-engines-block-manager", "BlockManager", by_the_block_manager),
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
    accepts(check_block_hash, "the-notebooks-solution", hash_block),
    refuses(check_block_hash, "the-engines-block_hash", "block_hash", block_hash),
    refuses(check_block_hash, "a-call-of-the-engines-block_hash", OWN_CODE, lambda p, t: block_hash(p, t)),
    *refuses_held(check_block_hash, "the-engines-block_hash", block_hash),
    refuses(check_block_hash, "the-engines-prefix-hashes", "prefix_block_hashes", by_the_prefix_hashes),
    refuses(check_block_hash, "the-engines-prefix-cache", "PrefixCache", by_the_prefix_cache),
    refuses(check_block_hash, "a-32-bit-crc", "zlib.crc32", crc32),
    refuses(check_block_hash, "a-7-byte-digest", "keep all 8 bytes", seven_bytes),
    refuses(check_block_hash, "bytes-of-the-ids", "bytes\\(ids\\) holds only values below 256", token_bytes),
    refuses(check_block_hash, "ids-modulo-256", "keep every bit of each token id", token_bytes_wrapped),
    refuses(check_block_hash, "ids-modulo-65536", "keep every bit of each token id", two_bytes_wrapped),
    refuses(check_block_hash, "ignores-the-parent", "mix the parent", lambda p, t: hash_block(None, t)),
    refuses(check_block_hash, "only-the-last-token", "not only the last", lambda p, t: hash_block(p, list(t)[-1:])),
    refuses(check_block_hash, "only-the-first-token", "not only the last \\(or the first\\)",
            lambda p, t: hash_block(p, list(t)[:1])),
    refuses(check_block_hash, "order-ignored", "order of the tokens matters", sorted_tokens),
    refuses(check_block_hash, "a-sum", "order of the tokens matters", lambda p, t: hash((p, sum(t)))),
    refuses(check_block_hash, "random", "same hash on every call", lambda p, t: random.getrandbits(64)),
    refuses(check_block_hash, "salted-str-hash", "salted per process", salted),
    refuses(check_block_hash, "small-modulus", "collide", lambda p, t: hash_block(p, t) % 97),
    refuses(check_block_hash, "a-string", "return an int", lambda p, t: str(hash_block(p, t))),
    accepts(check_paged_write, "the-notebooks-solution", paged_write),
    accepts(check_paged_write, "the-notebooks-solution-smollm-shapes", paged_write, PRESETS["smollm2-135m"]),
    accepts(check_paged_write, "a-loop-over-positions-from-the-front-of-the-free-list", paged_write_by_position),
    refuses(check_paged_write, "the-checkers-reference", OWN_CODE, reference_paged_write),
    refuses(check_paged_write, "a-call-of-the-checkers-reference", OWN_CODE,
            lambda *args: reference_paged_write(*args)),
    *refuses_held(check_paged_write, "the-checkers-reference", reference_paged_write),
    refuses(check_paged_write, "the-checkers-slots", "_slots", slots_of_the_checker),
    refuses(check_paged_write, "the-engines-paged-cache", "PagedKVCache", slots_of_the_paged_cache),
    refuses(check_paged_write, "the-engines-block-manager", "BlockManager", tables_of_the_block_manager),
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
    accepts(check_engine_step, "the-notebooks-solution", engine_step),
    refuses(check_engine_step, "the-checkers-reference", OWN_CODE, reference_engine_step),
    refuses(check_engine_step, "a-call-of-the-checkers-reference", OWN_CODE,
            lambda *args: reference_engine_step(*args)),
    *refuses_held(check_engine_step, "the-checkers-reference", reference_engine_step),
    refuses(check_engine_step, "chunks-from-budget_prefill_chunks", "budget_prefill_chunks", chunks_from_the_package),
    *refuses_held(check_engine_step, "budget_prefill_chunks", budget_prefill_chunks),
    refuses(check_engine_step, "the-engines-scheduler", "Scheduler", steps_of_the_engines_scheduler),
    refuses(check_engine_step, "the-checkers-package-steps", "package_steps", steps_of_the_checker),
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
    refuses(check_engine_step, "an-output-means-a-decode", "exactly one token left",
            stepped_by("an-output-means-a-decode")),
    refuses(check_engine_step, "a-call-per-row", "one forward pass per step", stepped_by("a-call-per-row")),
    refuses(check_engine_step, "a-token-per-chunk", "part-way through the prompt", stepped_by("a-token-per-chunk")),
    refuses(check_engine_step, "finished-keep-running", "has finished", stepped_by("finished-keep-running")),
    refuses(check_engine_step, "blocks-not-freed", "blocks go back", stepped_by("blocks-not-freed")),
    refuses(check_engine_step, "copies-the-sequences", "dicts themselves", copies_the_sequences),
]


# --- mutation testing (scripts/checker_mutants.py) --------------------------------------------------

EQUIVALENT_MUTANTS: dict[str, dict[str, str]] = {
    "serving-budget-chunks": {
        "18:15:swap-arguments:0<->1": "max(0, x) and max(x, 0) are the same number.",
        "45:16:swap-arguments:0<->1": "min(a, b) and min(b, a) are the same number.",
        "28:75:constant:1-1": (
            "with `== 0` no sequence counts as a decode, so each decoding sequence (one token left) takes its one "
            "token as a chunk of min(1, left) instead. The budget is at least max_slots, and every decoding "
            "sequence comes before every prefilling one in running (a prompt is admitted behind another only "
            "when the earlier one's tokens all fit in that step, and a preempted sequence comes back at the "
            "back), so the rows, their order, the admissions and what the budget leaves are the same at every "
            "step a scheduler can reach (3000 random workloads agree)."),
    },
}
