"""The reference of notebook 06b's exercise 1, one whole engine step on plain Python data, and the
package's own scheduler driven over the same workloads (`package_steps`): the two take the same
decisions at every step (tests/test_serving_step_checker.py), so the exercise asks for exactly
what the package does. `checks.serving_step` grades with them. Introduced in notebook 06b
(chunked prefill and prefix caching).
"""

from __future__ import annotations

from ..engine.serving.block_manager import BlockManager, blocks_needed
from ..engine.serving.request import Request, ServedSequence
from ..engine.serving.scheduler import Scheduler

MAX_STEPS = 5000                    # a workload that runs longer than this is a bug in the checker


def reference_engine_step(state: dict, model, max_slots: int, token_budget: int, block_size: int) -> dict:
    """One step of a continuous-batching engine with chunked prefill, on plain data (see the module's
    docstring); changes `state` and its sequences in place. Introduced in notebook 06b (chunked prefill and prefix caching).

    1. room to decode: each running sequence will hold computed + 1 positions; when that needs a
       block and none is free, the newest running sequence is preempted (its blocks back, computed
       0, to the front of the queue) until it fits (it may be the victim itself);
    2. decodes: running sequences with an output and one token left, one token of the budget each;
    3. admission, first come first served, while a slot is free, the prompts already in the step
       leave a token of the budget, and blocks for len(tokens) + 1 positions are free;
    4. chunks: the rest of the budget to the other running sequences, in order;
    5. one forward pass `model([(id, tokens), ...])` over the decodes and the non-empty chunks;
    6. a row whose tokens are all computed appends its next token; a sequence with max_new_tokens
       of them leaves the batch and gives its blocks back.

    Returns what the step did (for the checker's hints): preempted, decodes, admitted, why admission
    stopped, the chunks and the finished, as ids.
    """
    waiting, running = state["waiting"], state["running"]
    tokens = lambda seq: seq["prompt"] + seq["output"]                   # noqa: E731
    left_to_compute = lambda seq: len(tokens(seq)) - seq["computed"]     # noqa: E731
    trace = {"preempted": [], "admitted": [], "stop": "the queue is empty", "finished": []}
    for seq in list(running):                                            # 1. room for one more position each
        if not any(s is seq for s in running):
            continue                                                     # preempted a moment ago
        need = max(0, blocks_needed(seq["computed"] + 1, block_size) - seq["blocks"])
        while need > state["free_blocks"]:
            victim = running.pop()                                       # the most recently admitted
            state["free_blocks"] += victim["blocks"]
            victim["blocks"], victim["computed"] = 0, 0
            waiting.insert(0, victim)
            trace["preempted"].append(victim["id"])
            if victim is seq:
                break
        else:
            seq["blocks"] += need
            state["free_blocks"] -= need
    decodes = [s for s in running if s["output"] and left_to_compute(s) == 1]          # 2.
    prefills = [s for s in running if not (s["output"] and left_to_compute(s) == 1)]
    left = token_budget - len(decodes)
    while waiting:                                                       # 3. first come, first served
        seq = waiting[0]
        need = blocks_needed(len(tokens(seq)) + 1, block_size)
        if len(running) >= max_slots:
            trace["stop"] = "slots"
        elif sum(left_to_compute(s) for s in prefills) >= left:
            trace["stop"] = "budget"
        elif need > state["free_blocks"]:
            trace["stop"] = "blocks"
        else:
            waiting.pop(0)
            seq["blocks"] += need
            state["free_blocks"] -= need
            running.append(seq)
            prefills.append(seq)
            trace["admitted"].append(seq["id"])
            continue
        break
    rows = [(s, 1) for s in decodes]                                     # 4. decodes first, then chunks
    for seq in prefills:
        chunk = min(left_to_compute(seq), left)
        left -= chunk
        if chunk:
            rows.append((seq, chunk))
    trace.update(decodes=[s["id"] for s in decodes], chunks={s["id"]: n for s, n in rows[len(decodes):]})
    if not rows:
        return trace
    next_tokens = model([(s["id"], tokens(s)[s["computed"]: s["computed"] + n]) for s, n in rows])   # 5.
    for (seq, n), token in zip(rows, next_tokens):                       # 6.
        seq["computed"] += n
        if seq["computed"] == len(tokens(seq)):
            seq["output"].append(token)
            if len(seq["output"]) >= seq["max_new_tokens"]:
                running.remove(seq)
                state["free_blocks"] += seq["blocks"]
                seq["blocks"] = 0
                trace["finished"].append(seq["id"])
    return trace


def counting_next(tokens) -> int:
    """The counting model's next token after a row: its last token plus one. Notebook 06b (chunked prefill and prefix caching)."""
    return int(tokens[-1]) + 1


# --- the workloads and the package's run of them ---------------------------------------------------

def _synthetic(lengths, new_tokens, arrivals, first=0):
    """[(id, prompt, max_new_tokens, arrival step)]: prompts whose tokens (and so outputs) differ."""
    return [(first + i, [1000 * (i + 1) + 10 * j for j in range(n)], m, a)
            for i, (n, m, a) in enumerate(zip(lengths, new_tokens, arrivals))]


def workloads(requests=None, token_budget: int | None = None, max_slots: int | None = None) -> list[dict]:
    """The workloads the checker serves: four made-up ones (a first batch, a long prompt among
    arrivals, a cache too small for everyone, an answer preempted and then recomputed in chunks, its
    last chunk two tokens), then, if given, the notebook's `requests` (the first
    64: their prompts and answer lengths, one arriving per step) with its budget and slots, in a
    cache of half what its longest requests would hold in a full batch, so that it runs short.
    Notebook 06b (chunked prefill and prefix caching)."""
    made_up = [
        dict(name="a first batch", max_slots=3, token_budget=8, block_size=4, num_blocks=64,
             requests=_synthetic([5, 3, 11, 2, 7, 4], [3, 5, 2, 4, 1, 3], [0] * 6)),
        dict(name="a long prompt among arrivals", max_slots=4, token_budget=6, block_size=4, num_blocks=64,
             requests=_synthetic([3, 4, 23, 2, 5, 3], [6, 8, 3, 4, 2, 5], [0, 0, 2, 3, 3, 9])),
        dict(name="a cache too small for everyone", max_slots=4, token_budget=12, block_size=4, num_blocks=9,
             requests=_synthetic([7, 7, 5, 5, 7, 3], [10, 7, 10, 6, 4, 8], [0, 0, 1, 2, 2, 2])),
        dict(name="an answer preempted, then recomputed in chunks", max_slots=3, token_budget=3, block_size=4,
             num_blocks=3, requests=_synthetic([2, 4], [6, 2], [0, 0])),
    ]
    if requests is None:
        return made_up
    chosen = list(requests)[:64]
    slots = max_slots or 4
    budget = max(token_budget or 32, slots)
    block_size = 8
    longest = max(blocks_needed(len(r.prompt) + r.max_new_tokens + 1, block_size) for r in chosen)
    biggest = sorted((blocks_needed(len(r.prompt) + r.max_new_tokens, block_size) for r in chosen), reverse=True)
    num_blocks = max(longest + 1, sum(biggest[:slots]) // 2)
    real = [(i, list(r.prompt), r.max_new_tokens, i) for i, r in enumerate(chosen)]
    return made_up + [dict(name=f"the notebook's {len(real)} requests", max_slots=slots, token_budget=budget,
                           block_size=block_size, num_blocks=num_blocks, requests=real)]


def _snapshot_package(scheduler: Scheduler, blocks: BlockManager, seqs: dict) -> dict:
    return {"waiting": [s.id for s in scheduler.waiting], "running": [s.id for s in scheduler.running],
            "free_blocks": blocks.num_free,
            "seqs": {rid: (s.num_cached, tuple(s.output), len(blocks.table(s.index))) for rid, s in seqs.items()}}


def package_steps(workload: dict) -> list[dict]:
    """The package's own scheduler (continuous batching, the workload's token budget) over the
    workload, stepped as `Engine.step` steps it, with the counting model: one record per step,
    {"arrived": ids queued before it, "call": {id: tokens}, "preempted": ids, "after": the state after it}.
    Notebook 06b (chunked prefill and prefix caching)."""
    blocks = BlockManager(workload["num_blocks"], workload["block_size"])
    scheduler = Scheduler("continuous", workload["max_slots"], blocks, workload["token_budget"])
    seqs = {rid: ServedSequence(Request(list(prompt), max_new_tokens=n, request_id=rid), i, "cpu")
            for i, (rid, prompt, n, _) in enumerate(workload["requests"])}
    pending = sorted(workload["requests"], key=lambda r: r[3])
    records, clock = [], 0
    arrived = []
    while pending or scheduler.has_work:
        while pending and pending[0][3] <= clock:
            rid = pending.pop(0)[0]
            scheduler.add(seqs[rid])
            arrived.append(rid)
        if not scheduler.has_work:
            clock = pending[0][3]                         # idle: the next arrival
            continue
        plan = scheduler.schedule(clock)
        call = {s.id: tuple(s.tokens[s.num_cached: s.num_cached + n]) for s, n in plan.computed}
        tokens = [(s, counting_next(call[s.id])) for s, n in plan.computed if s.num_cached + n == len(s.tokens)]
        scheduler.postprocess(plan, tokens, clock + 1)
        records.append({"arrived": arrived, "call": call, "preempted": [s.id for s in plan.preempted],
                        "after": _snapshot_package(scheduler, blocks, seqs)})
        arrived, clock = [], clock + 1
        if len(records) > MAX_STEPS:
            raise AssertionError(f"workload {workload['name']!r} did not end in {MAX_STEPS} steps")
    return records
