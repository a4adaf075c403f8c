"""The hints of notebook 06b's exercise 1 (one whole engine step): at the first step where a
learner's step differs from the package's scheduler, the phase that went wrong (preemption,
admission, the forward pass's rows, the counters and tokens, finishing and blocks) and one hint
for it. Used by `checks.serving_step`. Introduced in notebook 06b (chunked prefill and prefix caching).
"""

from __future__ import annotations

import copy

from ..engine.serving.block_manager import blocks_needed
from .serving_step_reference import counting_next, reference_engine_step


def call_of(calls) -> dict | None:
    """A step's model calls as one {id: tokens}, empty rows left out; None when an id repeats.
    Notebook 06 (continuous batching)."""
    rows = [(rid, tuple(tokens)) for call in calls for rid, tokens in call if tokens]
    out = dict(rows)
    return out if len(out) == len(rows) else None


def diagnose(before, record, got, calls, seqs, params):
    """(hint, expected, got) for the first phase of the step that differs from the package's.
    Notebook 06 (continuous batching).

    Every earlier step matched, so the learner's state before this step is the package's; the
    reference step, run from it, says why each decision was taken."""
    max_slots, budget, block_size = params
    want, want_call = record["after"], record["call"]
    trace = reference_engine_step(copy.deepcopy(before), lambda rows: [counting_next(t) for _, t in rows], *params)
    seq_of = {s["id"]: s for s in before["waiting"] + before["running"]}
    tokens = {rid: len(s["prompt"]) + len(s["output"]) for rid, s in seq_of.items()}
    todo = {rid: tokens[rid] - s["computed"] for rid, s in seq_of.items()}
    pre_running = [s["id"] for s in before["running"]]
    pre_waiting = [s["id"] for s in before["waiting"]]
    limit = {rid: s["max_new_tokens"] for rid, s in seqs.items()}

    # 1. preemption: the running sequences that lost their cache
    def lost(snapshot):
        return sorted(rid for rid in pre_running if snapshot["seqs"][rid][1] == tuple(seq_of[rid]["output"])
                      and (rid in snapshot["waiting"] or snapshot["seqs"][rid][0] < seq_of[rid]["computed"]))
    want_lost, got_lost = lost(want), lost(got)
    if want_lost != got_lost:
        if not got_lost:
            hint = ("a running sequence needs a new block for its next position and none is free: preempt the "
                    "most recently admitted running sequence (its blocks back, computed = 0, to the front of the "
                    "queue) until it fits.")
        elif not want_lost:
            hint = ("preempt only when a running sequence's computed + 1 positions need a block and none is "
                    "free; every running sequence fits in this step.")
        else:
            hint = ("the victim is the most recently admitted running sequence (the last of running), then the "
                    "next newest, until the blocks suffice.")
        return hint, f"preempted {want_lost}", f"preempted {got_lost}"
    for rid in want_lost:
        if rid in want["waiting"] and rid in got["waiting"] and (
                got["waiting"].index(rid) != want["waiting"].index(rid)):
            return ("a preempted sequence goes back to the front of the queue, ahead of those that never ran.",
                    f"waiting {want['waiting']}", f"waiting {got['waiting']}")
        if rid in want["waiting"] and rid in got["waiting"] and got["seqs"][rid] != want["seqs"][rid]:
            return ("a preempted sequence loses its cache: computed = 0, and its blocks go back to free_blocks "
                    "(its tokens are computed again once it is admitted again).",
                    f"sequence {rid}: computed {want['seqs'][rid][0]}, blocks {want['seqs'][rid][2]}",
                    f"computed {got['seqs'][rid][0]}, blocks {got['seqs'][rid][2]}")

    # 2. admission
    def admitted(snapshot):
        return ([rid for rid in snapshot["running"] if rid not in pre_running or rid in want_lost]
                + [rid for rid in pre_waiting if rid not in snapshot["running"] and rid not in snapshot["waiting"]])
    want_in, got_in = admitted(want), admitted(got)
    decodes = trace["decodes"]
    recompute = ("a preempted sequence comes back with its prompt and its output too: its blocks and its prefill "
                 "cover all of prompt + output.")
    in_step = sum(todo[rid] for rid in pre_running if rid not in want_lost and rid not in decodes)
    if sorted(want_in) != sorted(got_in):
        queue = want_in + [rid for rid in want["waiting"] if rid not in want_in]
        came_back = [rid for rid in got_in if seq_of[rid]["output"]]
        if any(got["seqs"][rid][2] == blocks_needed(len(seq_of[rid]["prompt"]) + 1, block_size)
               < blocks_needed(tokens[rid] + 1, block_size) for rid in came_back):
            hint = recompute
        elif sorted(got_in) != sorted(queue[:len(got_in)]):
            hint = ("first come, first served: admit from the front of the queue and stop at the first sequence "
                    "that does not fit; a later one must not jump ahead of it.")
        elif len(got_in) > len(want_in):
            nxt = queue[len(want_in)]
            prompts = in_step + sum(tokens[rid] for rid in want_in)          # a newcomer computes all its tokens
            if trace["stop"] == "slots":
                hint = f"at most max_slots = {max_slots} sequences run: admit only while a slot is free."
            elif trace["stop"] == "budget" and decodes and prompts < budget:
                hint = ("each decode costs one token of the budget first: after the decodes, the prompt tokens "
                        "already in this step leave no token for a newcomer.")
            elif trace["stop"] == "budget":
                hint = ("admit a newcomer only while the step's budget still has a token for it, after the decodes "
                        "and the prompt tokens already in the step.")
            elif got["seqs"][nxt][2] == blocks_needed(tokens[nxt], block_size):
                hint = ("a newcomer takes blocks for len(tokens) + 1 positions: its prompt and the position of "
                        "its first decode.")
            else:
                hint = ("admit a newcomer only while the blocks for its len(tokens) + 1 positions are free; stop "
                        "at the first that does not fit.")
        else:
            nxt = queue[len(got_in)]
            left = budget - len(decodes) - in_step - sum(tokens[rid] for rid in want_in[:len(got_in)])
            if any(got["seqs"][rid][2] > want["seqs"][rid][2] for rid in got_in):
                hint = ("a newcomer takes blocks for len(tokens) + 1 positions only; it gets more as it grows, one "
                        "block at a time.")
            elif tokens[nxt] > left > 0:
                hint = ("a newcomer needs only one token of the budget to be admitted: a long prompt is split "
                        "across steps, a chunk each step.")
            else:
                hint = ("admit from the front of the queue while a slot, the blocks for len(tokens) + 1 "
                        "positions and a token of the budget are free (a finished sequence's slot is free at once).")
        return hint, f"admitted {want_in}", f"admitted {got_in}"

    # 3. the forward pass: one call, its rows
    if len(calls) > 1:
        return ("one forward pass per step: call model once, with every decode and every prompt chunk as rows.",
                "1 call of model", f"{len(calls)} calls")
    call = call_of(calls)
    if call is None:
        return ("one row per sequence: a sequence computes one chunk (or one decode) per step.",
                "each id once in the rows", "an id twice")
    if call != want_call:
        sizes = {rid: len(t) for rid, t in call.items()}
        want_sizes = {rid: len(t) for rid, t in want_call.items()}
        shown = f"rows (id: number of tokens) {want_sizes}", f"{sizes}"
        if not calls:
            return "call model once with the step's rows: the decodes and the prompt chunks.", *shown
        if any(sizes.get(rid) != 1 for rid in decodes):
            return ("every running sequence with an output and one token left to compute decodes: a row of its "
                    "newest token.", *shown)
        prompts = sum(n for rid, n in sizes.items() if rid not in decodes)
        if sum(sizes.values()) > budget:
            if decodes and prompts <= budget:
                return ("each decode costs one token of the budget: the prompt chunks share token_budget minus "
                        "the decodes.", *shown)
            return (f"a step computes at most token_budget = {budget} tokens: a long prompt gets what is left, "
                    "and the rest in later steps.", *shown)
        if sizes == want_sizes:
            return ("a row computes the tokens its sequence has not computed yet: (prompt + output)[computed : "
                    "computed + n].", f"rows {want_call}"[:240], f"{call}"[:240])
        order = [rid for rid in want_sizes if rid not in decodes]
        for i, rid in enumerate(order):
            if sizes.get(rid, 0) >= want_sizes[rid]:
                continue
            if seq_of[rid]["output"] and seq_of[rid]["computed"] < len(seq_of[rid]["prompt"]):
                return recompute, *shown
            if sizes.get(rid, 0) == 0 and todo[rid] > want_sizes[rid]:
                return ("split a long prompt: it gets what is left of the budget now and the rest in later steps; "
                        "a later prompt must not jump ahead of it.", *shown)
            if any(sizes.get(r, 0) for r in order[i + 1:]):
                return ("what is left of the budget goes to the prefilling sequences in order of admission: each "
                        "takes all it can before the next gets any.", *shown)
        return ("after the decodes, each prefilling sequence in order gets min(its tokens left, what is left of "
                "the budget).", *shown)

    # 4. counters and tokens
    for rid, (done, output, _) in want["seqs"].items():
        got_done, got_output, _ = got["seqs"][rid]
        if rid in want_call and got_done != done:
            return ("after the forward pass each row's computed grows by the tokens it computed.",
                    f"sequence {rid}: computed = {done}", f"computed = {got_done}")
        if got_output != output:
            if len(got_output) > len(output):
                hint = ("only a sequence whose tokens are all computed gets a token: a chunk that ends part-way "
                        "through the prompt gives none.")
            elif len(got_output) < len(output):
                hint = ("a row that computes its sequence's last uncomputed token gives the next token: append the "
                        "model's token for that row to its output.")
            else:
                hint = "append the token the model returned for that row (one per row, in the order of the rows)."
            return hint, f"sequence {rid}: output {list(output)}", f"{list(got_output)}"

    # 5. finishing, slots and blocks
    finished = [rid for rid in seq_of if len(want["seqs"][rid][1]) > len(seq_of[rid]["output"])
                and len(want["seqs"][rid][1]) >= limit[rid]]
    if any(len(got["seqs"][rid][1]) >= limit[rid] for rid in got["running"] + got["waiting"]):
        return ("a sequence with max_new_tokens outputs has finished: take it out of running and give its blocks "
                "back.", f"running {want['running']}", f"running {got['running']}")
    if len(got["running"]) > max_slots:
        return (f"at most max_slots = {max_slots} sequences run.", f"running {want['running']}",
                f"running {got['running']}")
    for rid, (_, _, held) in want["seqs"].items():
        got_held = got["seqs"][rid][2]
        if got_held == held:
            continue
        if rid in finished:
            hint = "a finished sequence gives back all its blocks: add them to free_blocks and set its blocks to 0."
        elif rid in decodes and got_held < held:
            hint = ("before the step, a running sequence whose computed + 1 positions need another block takes "
                    "one from free_blocks.")
        elif rid in want_in:
            hint = ("at admission a newcomer takes blocks for len(tokens) + 1 positions from free_blocks: its "
                    "prompt and its first decode.")
        else:
            hint = "a sequence holds ceil(positions / block_size) blocks: one more only when its last block is full."
        return hint, f"sequence {rid}: blocks = {held}", f"blocks = {got_held}"
    if got["free_blocks"] != want["free_blocks"]:
        if finished and got["free_blocks"] < want["free_blocks"]:
            hint = "a finished sequence's blocks go back: add them to free_blocks."
        else:
            hint = ("free_blocks counts the blocks no sequence holds: take from it what a sequence gets, and add "
                    "back what one gives.")
        return hint, f"free_blocks = {want['free_blocks']}", f"free_blocks = {got['free_blocks']}"
    return ("keep running in order of admission and waiting in the queue's order.",
            f"running {want['running']}, waiting {want['waiting']}",
            f"running {got['running']}, waiting {got['waiting']}")
