"""The hints of notebook 06b's exercise 1 (one whole engine step): at the first step where a
learner's step differs from the package's scheduler, the phase that went wrong (preemption,
admission, the forward pass's rows, the counters and tokens, finishing and blocks) and one hint
for it. Used by `checks.serving_step`. Introduced in notebook 06b (chunked prefill and prefix caching).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..engine.serving.block_manager import blocks_needed
from .serving_step_reference import counting_next, reference_engine_step


def call_of(calls) -> dict | None:
    """A step's model calls as one {id: tokens}, empty rows left out; None when an id repeats.
    Notebook 06b (chunked prefill and prefix caching)."""
    rows = [(rid, tuple(tokens)) for call in calls for rid, tokens in call if tokens]
    out = dict(rows)
    return out if len(out) == len(rows) else None


def diagnose(before, record, got, calls, seqs, params):
    """(hint, expected, got) for the first phase of the step that differs from the package's.
    Notebook 06b (chunked prefill and prefix caching).

    Every earlier step matched, so the learner's state before this step is the package's; the
    reference step, run from it, says why each decision was taken."""
    step = _read_step(before, record, got, calls, seqs, params)
    for phase in (_preemption_hint, _requeue_hint,    # 1. preemption: the running sequences that lost their cache
                  _admission_hint,                    # 2. admission
                  _forward_pass_hint,                 # 3. the forward pass: one call, its rows
                  _counters_hint,                     # 4. counters and tokens
                  _finishing_hint, _blocks_hint):     # 5. finishing, slots and blocks
        found = phase(step)
        if found is not None:
            return found
    return _order_hint(step)


_RECOMPUTE = ("a preempted sequence comes back with its prompt and its output too: its blocks and its prefill "
              "cover all of prompt + output.")


@dataclass
class _Step:
    """What the package's step did from the learner's state before it, and what the learner's step did.
    Notebook 06b (chunked prefill and prefix caching)."""

    want: dict                  # the package's state after the step (the record's "after")
    want_call: dict             # the package's forward pass, {id: tokens}
    got: dict                   # the learner's state after the step
    calls: list                 # the learner's model calls
    trace: dict                 # why the package's step decided what it did (`reference_engine_step`)
    seq_of: dict                # id -> its sequence before the step
    tokens: dict                # id -> len(prompt + output) before the step
    todo: dict                  # id -> its tokens not computed yet before the step
    pre_running: list           # the ids running before the step
    pre_waiting: list           # the ids waiting before the step
    limit: dict                 # id -> its max_new_tokens
    max_slots: int
    budget: int
    block_size: int
    want_lost: list = field(default_factory=list)     # the ids the package's step preempted
    want_in: list = field(default_factory=list)       # the ids the package's step admitted

    def lost(self, snapshot) -> list:
        """The running sequences that lost their cache in `snapshot`, sorted.
        Notebook 06b (chunked prefill and prefix caching)."""
        return sorted(rid for rid in self.pre_running
                      if snapshot["seqs"][rid][1] == tuple(self.seq_of[rid]["output"])
                      and (rid in snapshot["waiting"] or snapshot["seqs"][rid][0] < self.seq_of[rid]["computed"]))

    def admitted(self, snapshot) -> list:
        """The sequences admitted in `snapshot`: newly running, then gone from the queue.
        Notebook 06b (chunked prefill and prefix caching)."""
        return ([rid for rid in snapshot["running"] if rid not in self.pre_running or rid in self.want_lost]
                + [rid for rid in self.pre_waiting if rid not in snapshot["running"]
                   and rid not in snapshot["waiting"]])

    @property
    def decodes(self) -> list:
        """The sequences the package's step decoded. Notebook 06b (chunked prefill and prefix caching)."""
        return self.trace["decodes"]

    @property
    def in_step(self) -> int:
        """The prompt tokens the running sequences kept compute in this step, before any newcomer.
        Notebook 06b (chunked prefill and prefix caching)."""
        return sum(self.todo[rid] for rid in self.pre_running
                   if rid not in self.want_lost and rid not in self.decodes)

    @property
    def finished(self) -> list:
        """The sequences the package's step finished. Notebook 06b (chunked prefill and prefix caching)."""
        return [rid for rid in self.seq_of if len(self.want["seqs"][rid][1]) > len(self.seq_of[rid]["output"])
                and len(self.want["seqs"][rid][1]) >= self.limit[rid]]


def _read_step(before, record, got, calls, seqs, params) -> _Step:
    """Run the package's step from `before` and gather what it did next to the learner's.
    Notebook 06b (chunked prefill and prefix caching)."""
    max_slots, budget, block_size = params
    want, want_call = record["after"], record["call"]
    trace = reference_engine_step(copy.deepcopy(before), lambda rows: [counting_next(t) for _, t in rows], *params)
    seq_of = {s["id"]: s for s in before["waiting"] + before["running"]}
    tokens = {rid: len(s["prompt"]) + len(s["output"]) for rid, s in seq_of.items()}
    todo = {rid: tokens[rid] - s["computed"] for rid, s in seq_of.items()}
    pre_running = [s["id"] for s in before["running"]]
    pre_waiting = [s["id"] for s in before["waiting"]]
    limit = {rid: s["max_new_tokens"] for rid, s in seqs.items()}
    step = _Step(want, want_call, got, calls, trace, seq_of, tokens, todo, pre_running, pre_waiting, limit,
                 max_slots, budget, block_size)
    step.want_lost = step.lost(want)
    step.want_in = step.admitted(want)
    return step


def _preemption_hint(step: _Step):
    """A hint when the learner preempted other running sequences than the package did.
    Notebook 06b (chunked prefill and prefix caching)."""
    want_lost, got_lost = step.want_lost, step.lost(step.got)
    if want_lost == got_lost:
        return None
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


def _requeue_hint(step: _Step):
    """A hint when a preempted sequence went to the wrong place in the queue or kept its cache.
    Notebook 06b (chunked prefill and prefix caching)."""
    want, got = step.want, step.got
    for rid in step.want_lost:
        if rid in want["waiting"] and rid in got["waiting"] and (
                got["waiting"].index(rid) != want["waiting"].index(rid)):
            return ("a preempted sequence goes back to the front of the queue, ahead of those that never ran.",
                    f"waiting {want['waiting']}", f"waiting {got['waiting']}")
        if rid in want["waiting"] and rid in got["waiting"] and got["seqs"][rid] != want["seqs"][rid]:
            return ("a preempted sequence loses its cache: computed = 0, and its blocks go back to free_blocks "
                    "(its tokens are computed again once it is admitted again).",
                    f"sequence {rid}: computed {want['seqs'][rid][0]}, blocks {want['seqs'][rid][2]}",
                    f"computed {got['seqs'][rid][0]}, blocks {got['seqs'][rid][2]}")
    return None


def _admission_hint(step: _Step):
    """A hint when the learner admitted other sequences than the package did.
    Notebook 06b (chunked prefill and prefix caching)."""
    want_in, got_in, got = step.want_in, step.admitted(step.got), step.got
    if sorted(want_in) == sorted(got_in):
        return None
    queue = want_in + [rid for rid in step.want["waiting"] if rid not in want_in]
    came_back = [rid for rid in got_in if step.seq_of[rid]["output"]]
    if any(got["seqs"][rid][2] == blocks_needed(len(step.seq_of[rid]["prompt"]) + 1, step.block_size)
           < blocks_needed(step.tokens[rid] + 1, step.block_size) for rid in came_back):
        hint = _RECOMPUTE
    elif sorted(got_in) != sorted(queue[:len(got_in)]):
        hint = ("first come, first served: admit from the front of the queue and stop at the first sequence "
                "that does not fit; a later one must not jump ahead of it.")
    elif len(got_in) > len(want_in):
        hint = _too_many_admitted_hint(step, queue)
    else:
        hint = _too_few_admitted_hint(step, queue, got_in)
    return hint, f"admitted {want_in}", f"admitted {got_in}"


def _too_many_admitted_hint(step: _Step, queue):
    """Why the package's admission stopped before the learner's did: slots, budget or blocks.
    Notebook 06b (chunked prefill and prefix caching)."""
    want_in, decodes, trace = step.want_in, step.decodes, step.trace
    nxt = queue[len(want_in)]
    prompts = step.in_step + sum(step.tokens[rid] for rid in want_in)          # a newcomer computes all its tokens
    if trace["stop"] == "slots":
        return f"at most max_slots = {step.max_slots} sequences run: admit only while a slot is free."
    if trace["stop"] == "budget" and decodes and prompts < step.budget:
        return ("each decode costs one token of the budget first: after the decodes, the prompt tokens "
                "already in this step leave no token for a newcomer.")
    if trace["stop"] == "budget":
        return ("admit a newcomer only while the step's budget still has a token for it, after the decodes "
                "and the prompt tokens already in the step.")
    if step.got["seqs"][nxt][2] == blocks_needed(step.tokens[nxt], step.block_size):
        return ("a newcomer takes blocks for len(tokens) + 1 positions: its prompt and the position of "
                "its first decode.")
    return ("admit a newcomer only while the blocks for its len(tokens) + 1 positions are free; stop "
            "at the first that does not fit.")


def _too_few_admitted_hint(step: _Step, queue, got_in):
    """Why the package admitted a sequence the learner left in the queue.
    Notebook 06b (chunked prefill and prefix caching)."""
    nxt = queue[len(got_in)]
    left = step.budget - len(step.decodes) - step.in_step - sum(step.tokens[rid] for rid in step.want_in[:len(got_in)])
    if any(step.got["seqs"][rid][2] > step.want["seqs"][rid][2] for rid in got_in):
        return ("a newcomer takes blocks for len(tokens) + 1 positions only; it gets more as it grows, one "
                "block at a time.")
    if step.tokens[nxt] > left > 0:
        return ("a newcomer needs only one token of the budget to be admitted: a long prompt is split "
                "across steps, a chunk each step.")
    return ("admit from the front of the queue while a slot, the blocks for len(tokens) + 1 "
            "positions and a token of the budget are free (a finished sequence's slot is free at once).")


def _forward_pass_hint(step: _Step):
    """A hint when the learner called the model more than once, or with other rows than the package.
    Notebook 06b (chunked prefill and prefix caching)."""
    calls = step.calls
    if len(calls) > 1:
        return ("one forward pass per step: call model once, with every decode and every prompt chunk as rows.",
                "1 call of model", f"{len(calls)} calls")
    call = call_of(calls)
    if call is None:
        return ("one row per sequence: a sequence computes one chunk (or one decode) per step.",
                "each id once in the rows", "an id twice")
    if call != step.want_call:
        return _rows_hint(step, call)
    return None


def _rows_hint(step: _Step, call):
    """A hint for the rows of a forward pass that differ from the package's.
    Notebook 06b (chunked prefill and prefix caching)."""
    budget, decodes, want_call = step.budget, step.decodes, step.want_call
    sizes = {rid: len(t) for rid, t in call.items()}
    want_sizes = {rid: len(t) for rid, t in want_call.items()}
    shown = f"rows (id: number of tokens) {want_sizes}", f"{sizes}"
    if not step.calls:
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
    return _chunks_hint(step, sizes, want_sizes, shown)


def _chunks_hint(step: _Step, sizes, want_sizes, shown):
    """A hint for prompt chunks that share the budget otherwise than the package's.
    Notebook 06b (chunked prefill and prefix caching)."""
    seq_of, decodes = step.seq_of, step.decodes
    order = [rid for rid in want_sizes if rid not in decodes]
    for i, rid in enumerate(order):
        if sizes.get(rid, 0) >= want_sizes[rid]:
            continue
        if seq_of[rid]["output"] and sizes.get(rid) == 1 and step.todo[rid] > 1:
            return ("a sequence decodes only when it has an output and exactly one token left to compute; a "
                    "preempted one with more left computes them as a prompt chunk.", *shown)
        if seq_of[rid]["output"] and seq_of[rid]["computed"] < len(seq_of[rid]["prompt"]):
            return _RECOMPUTE, *shown
        if sizes.get(rid, 0) == 0 and step.todo[rid] > want_sizes[rid]:
            return ("split a long prompt: it gets what is left of the budget now and the rest in later steps; "
                    "a later prompt must not jump ahead of it.", *shown)
        if any(sizes.get(r, 0) for r in order[i + 1:]):
            return ("what is left of the budget goes to the prefilling sequences in order of admission: each "
                    "takes all it can before the next gets any.", *shown)
    return ("after the decodes, each prefilling sequence in order gets min(its tokens left, what is left of "
            "the budget).", *shown)


def _counters_hint(step: _Step):
    """A hint when a sequence's computed or output differs from the package's after the pass.
    Notebook 06b (chunked prefill and prefix caching)."""
    for rid, (done, output, _) in step.want["seqs"].items():
        got_done, got_output, _ = step.got["seqs"][rid]
        if rid in step.want_call and got_done != done:
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
    return None


def _finishing_hint(step: _Step):
    """A hint when a finished sequence still runs or waits, or more than max_slots run.
    Notebook 06b (chunked prefill and prefix caching)."""
    want, got = step.want, step.got
    if any(len(got["seqs"][rid][1]) >= step.limit[rid] for rid in got["running"] + got["waiting"]):
        return ("a sequence with max_new_tokens outputs has finished: take it out of running and give its blocks "
                "back.", f"running {want['running']}", f"running {got['running']}")
    if len(got["running"]) > step.max_slots:
        return (f"at most max_slots = {step.max_slots} sequences run.", f"running {want['running']}",
                f"running {got['running']}")
    return None


def _blocks_hint(step: _Step):
    """A hint when a sequence's blocks, or free_blocks, differ from the package's.
    Notebook 06b (chunked prefill and prefix caching)."""
    want, got, finished = step.want, step.got, step.finished
    for rid, (_, _, held) in want["seqs"].items():
        got_held = got["seqs"][rid][2]
        if got_held == held:
            continue
        if rid in finished:
            hint = "a finished sequence gives back all its blocks: add them to free_blocks and set its blocks to 0."
        elif rid in step.decodes and got_held < held:
            hint = ("before the step, a running sequence whose computed + 1 positions need another block takes "
                    "one from free_blocks.")
        elif rid in step.want_in:
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
    return None


def _order_hint(step: _Step):
    """The hint left when every phase matched: the order of running and of the queue.
    Notebook 06b (chunked prefill and prefix caching)."""
    want, got = step.want, step.got
    return ("keep running in order of admission and waiting in the queue's order.",
            f"running {want['running']}, waiting {want['waiting']}",
            f"running {got['running']}, waiting {got['waiting']}")
