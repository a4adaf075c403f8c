"""The checker of notebook 06b's exercise 1: one whole engine step (preemption, decodes, admission,
chunked prefill under a token budget, one forward pass, finishing), written on plain Python data.

The learner's `engine_step(state, model, max_slots, token_budget, block_size)` runs in a loop over
simulated workloads, with a counting model (its next token is the row's last token plus one).
After every step the queue, the batch, the free blocks, each sequence's counters and the model's
rows are compared with what the package's own `Scheduler` (continuous batching with a token budget,
driven as `Engine.step` drives it) did at that step. At the first difference the checker names
the phase that went wrong, with one hint. Introduced in notebook 06b (chunked prefill and prefix caching).

The plain data (one dict per sequence)::

    state = {"waiting": [seq, ...],     # the queue, its front first
             "running": [seq, ...],     # in order of admission
             "free_blocks": 12}         # cache blocks no sequence holds
    seq = {"id": 3, "prompt": [...], "output": [...], "max_new_tokens": 8,
           "computed": 0,               # how many of prompt + output are in the cache
           "blocks": 0}                 # cache blocks it holds
"""

from __future__ import annotations

import copy

from .serving_step_hints import call_of, diagnose
from .grading import Exercise, graded
from .serving_step_reference import counting_next, package_steps, workloads
from . import CheckFailed, fail, grades_quietly, passed

STEP = "one whole engine step"
SCHEDULER = "labsupport.engine.serving.scheduler."
STEP_EXERCISE = Exercise(
    title=STEP, teaches="one engine step: preemption, decodes, admission, prompt chunks under a token budget, "
                        "one forward pass and finishing",
    computed_by=tuple(SCHEDULER + name for name in (
        "budget_prefill_chunks", "Scheduler", "Scheduler.schedule", "Scheduler.postprocess", "StaticBatching",
        "StaticBatching.decide", "ContinuousBatching", "ContinuousBatching.decide", "as_policy")))


def _plain(rid, prompt, max_new_tokens) -> dict:
    return {"id": rid, "prompt": list(prompt), "output": [], "max_new_tokens": max_new_tokens,
            "computed": 0, "blocks": 0}


class _CountingModel:
    """The model the learner's step calls: records each call's rows, returns each row's last token + 1."""

    def __init__(self, known):
        self.known, self.calls = known, []

    def __call__(self, rows):
        try:
            rows = [(rid, [int(t) for t in tokens]) for rid, tokens in rows]
        except (TypeError, ValueError):
            fail(STEP, "rows of (id, tokens) pairs", repr(rows)[:80],
                 "call model with a list of (id, tokens) pairs: each row's sequence id and the token ids it computes.")
        unknown = [rid for rid, _ in rows if rid not in self.known]
        if unknown:
            fail(STEP, "rows named by the sequences' ids", f"row id {unknown[0]!r}",
                 'name each row by its sequence\'s seq["id"].')
        if any(tokens for _, tokens in rows):
            self.calls.append(rows)
        return [counting_next(tokens) if tokens else 0 for _, tokens in rows]


def _snapshot_plain(state, seqs: dict) -> dict:
    """The learner's state in the shape of the package's snapshot."""
    return {"waiting": [s["id"] for s in state["waiting"]], "running": [s["id"] for s in state["running"]],
            "free_blocks": state["free_blocks"],
            "seqs": {rid: (s["computed"], tuple(s["output"]), s["blocks"]) for rid, s in seqs.items()}}


def _check_shape(state, seqs: dict, where: str) -> None:
    """The state is still plain data the checker can read: lists of the same sequence dicts, ints."""
    lists = state.get("waiting"), state.get("running")
    if not all(isinstance(x, list) for x in lists) or isinstance(state.get("free_blocks"), bool) or not isinstance(
            state.get("free_blocks"), int):
        fail(STEP, 'state["waiting"] and state["running"] lists, state["free_blocks"] an int',
             {k: type(v).__name__ for k, v in state.items()},
             f"change the state in place: move sequences between the two lists, count the free blocks as an int. "
             f"{where}")
    originals = {id(s) for s in seqs.values()}
    if any(id(s) not in originals for s in lists[0] + lists[1]):
        fail(STEP, "the sequences' own dicts in the lists", "copies of them",
             f"move the sequence dicts themselves between the lists and change them in place; the checker reads "
             f"them. {where}")
    for seq in seqs.values():
        if not (isinstance(seq.get("computed"), int) and isinstance(seq.get("blocks"), int)
                and isinstance(seq.get("output"), list)):
            fail(STEP, 'each sequence with int "computed" and "blocks" and a list "output"',
                 {k: type(v).__name__ for k, v in seq.items()}, f"keep every key of a sequence dict. {where}")


def _before(state) -> str:
    """The state before a step, in a few words: running (computed/tokens, blocks), waiting, free blocks."""
    running = ", ".join(f"{s['id']} ({s['computed']}/{len(s['prompt']) + len(s['output'])} computed, "
                        f"{s['blocks']} blocks)" for s in state["running"])
    return (f"Before it: running [{running}], waiting {[s['id'] for s in state['waiting']]}, "
            f"free_blocks {state['free_blocks']}.")


@grades_quietly
@graded(STEP_EXERCISE)
def check_engine_step(fn, requests=None, token_budget: int | None = None, max_slots: int | None = None) -> None:
    """Check `fn(state, model, max_slots, token_budget, block_size)`, one engine step on plain data,
    by serving whole workloads with it, step by step against the package's own scheduler.

    Introduced in notebook 06b (chunked prefill and prefix caching). requests, token_budget, max_slots: the
    notebook's workload (the requests of its load curve), its budget and its slots, served after the
    four made-up workloads (up to 64 requests, one arriving per step, in a small cache).
    """
    steps = preemptions = 0
    served = workloads(requests, token_budget, max_slots)
    for workload in served:
        records = package_steps(workload)
        seqs = {rid: _plain(rid, prompt, n) for rid, prompt, n, _ in workload["requests"]}
        state = {"waiting": [], "running": [], "free_blocks": workload["num_blocks"]}
        counter = _CountingModel(seqs)
        params = (workload["max_slots"], workload["token_budget"], workload["block_size"])
        for number, record in enumerate(records, 1):
            state["waiting"] += [seqs[rid] for rid in record["arrived"]]
            before = copy.deepcopy(state)
            counter.calls = []
            where = (f"Step {number} of the workload {workload['name']!r} (max_slots={params[0]}, "
                     f"token_budget={params[1]}, block_size={params[2]}). {_before(before)}")
            try:
                fn(state, counter, *params)
            except (NotImplementedError, CheckFailed):
                raise
            except Exception as error:                       # noqa: BLE001 - the learner's code failed
                hint = ('a sequence dict holds "id", "prompt", "output", "max_new_tokens", "computed" and '
                        '"blocks"; state holds "waiting", "running" and "free_blocks".'
                        if isinstance(error, KeyError) else "your step raised an error on the state below.")
                fail(STEP, "a step that runs", f"{type(error).__name__}: {str(error)[:80]}", f"{hint} {where}")
            _check_shape(state, seqs, where)
            got, call = _snapshot_plain(state, seqs), call_of(counter.calls)
            if got == record["after"] and call == record["call"] and len(counter.calls) <= 1:
                continue
            try:
                hint, want, have = diagnose(before, record, got, counter.calls, seqs, params)
            except (KeyError, IndexError, ValueError, TypeError):       # a state too far off to name the phase
                want = {k: v for k, v in record["after"].items() if k != "seqs"}
                have = {k: v for k, v in got.items() if k != "seqs"}
                hint = "compare your step with the six phases above, in their order."
            fail(STEP, want, have, f"{hint} {where}")
        steps += len(records)
        preemptions += sum(len(r["preempted"]) for r in records)
    passed(STEP, f"{steps} steps of {len(served)} workloads, each as the package's scheduler took it, "
                 f"{preemptions} preemptions included.")
