"""Notebook 06's exercise 4 (one whole engine step on plain data) and exercise 3 (one step's keys
written into the paged pool): the exercise's step is the package's, and the checkers stand firm.

* The plain-data reference (`checks.serving_step.reference_engine_step`) takes, on random
  workloads, every decision the package's `Scheduler` takes (so the exercise defines nothing the
  package does not do), and the checker's driving of the scheduler schedules what `Engine.run`
  schedules on a real (tiny) model.
* The checker serves the notebook's kind of workload (chat-like prompts longer than the budget)
  in well under a second; a learner's step that calls the package's answer, even through the
  notebook's own import, is refused; a mixture of mistakes is refused with a hint and the step
  it went wrong at, never with an internal error.
The accepted answers and each typical mistake are rows of tests/checker_cases/nb06_serving.py.
"""

import random
import re
import sys
import time
import types

import pytest

from labsupport.checks import CheckFailed
from labsupport.checks.serving_step import _plain, check_engine_step
from labsupport.checks.serving_step_reference import counting_next, package_steps, reference_engine_step, workloads
from labsupport.checks.serving_write import check_paged_write, reference_paged_write
from labsupport.engine.serving import Engine, Request, budget_prefill_chunks

from checker_cases.nb06_serving import engine_step, paged_write

WRITE_IT = "expected your own code"


def random_workload(rng: random.Random, name: str) -> dict:
    slots, block_size = rng.randint(1, 5), rng.choice([1, 2, 4, 8])
    lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 9))]
    answers = [rng.randint(1, 12) for _ in lengths]
    longest = max(-(-(n + m + 1) // block_size) for n, m in zip(lengths, answers))
    return dict(name=name, max_slots=slots, token_budget=rng.randint(slots, 3 * slots + 10), block_size=block_size,
                num_blocks=longest + rng.randint(0, 20),
                requests=[(i, [rng.randint(1, 99) for _ in range(n)], m, rng.randint(0, 15))
                          for i, (n, m) in enumerate(zip(lengths, answers))])


def plain_run(workload: dict) -> int:
    """Serve `workload` with the plain reference, asserting its state after every step is the package's."""
    seqs = {rid: _plain(rid, prompt, n) for rid, prompt, n, _ in workload["requests"]}
    state = {"waiting": [], "running": [], "free_blocks": workload["num_blocks"]}
    records = package_steps(workload)
    for number, record in enumerate(records, 1):
        state["waiting"] += [seqs[rid] for rid in record["arrived"]]
        reference_engine_step(state, lambda rows: [counting_next(t) for _, t in rows],
                              workload["max_slots"], workload["token_budget"], workload["block_size"])
        got = {"waiting": [s["id"] for s in state["waiting"]], "running": [s["id"] for s in state["running"]],
               "free_blocks": state["free_blocks"],
               "seqs": {rid: (s["computed"], tuple(s["output"]), s["blocks"]) for rid, s in seqs.items()}}
        assert got == record["after"], f"{workload['name']}, step {number}"
    return sum(len(r["preempted"]) for r in records)


def test_the_plain_step_takes_every_decision_the_package_takes():
    rng = random.Random(0)
    preempted = sum(plain_run(random_workload(rng, f"random {i}")) for i in range(300))
    assert preempted > 50                                   # the random caches run short often enough
    assert all(plain_run(w) >= 0 for w in workloads())


def test_the_checkers_driving_schedules_what_the_engine_schedules(tiny_llama):
    """Per step, the decodes, the prompt tokens and the preemptions of `package_steps` are those of
    `Engine.run` (clock="steps") on a tiny model: the schedule depends on lengths only."""
    for workload in workloads():
        requests = [Request([t % 250 for t in prompt], max_new_tokens=n, arrival=arrival, request_id=rid)
                    for rid, prompt, n, arrival in workload["requests"]]
        engine = Engine(tiny_llama, max_slots=workload["max_slots"], block_size=workload["block_size"],
                        cache_tokens=workload["num_blocks"] * workload["block_size"],
                        token_budget=workload["token_budget"], cuda_graphs=False)
        run = engine.run(requests, clock="steps")
        records = package_steps(workload)
        assert len(run.steps) == len(records), workload["name"]
        assert [s.preempted for s in run.steps] == [len(r["preempted"]) for r in records], workload["name"]
        assert [s.decode_rows + s.prefill_tokens for s in run.steps] == [
            sum(map(len, r["call"].values())) for r in records], workload["name"]


def test_the_notebooks_kind_of_workload_is_served_quickly(capsys):
    rng = random.Random(1)
    system = [rng.randint(1, 500) for _ in range(30)]                     # a shared chat template
    requests = [Request(system + [rng.randint(1, 500) for _ in range(rng.randint(4, 12))],
                        max_new_tokens=rng.randint(2, 32)) for _ in range(12)]
    started = time.perf_counter()
    check_engine_step(engine_step, requests, 32, 4)
    assert time.perf_counter() - started < 2.0
    out = capsys.readouterr().out
    assert "Correct" in out and "5 workloads" in out


def test_a_call_of_the_package_through_the_notebooks_import_is_refused(monkeypatch):
    main = types.ModuleType("__main__")
    main.budget_prefill_chunks = budget_prefill_chunks
    main.engine_step = engine_step
    exec("def my_step(state, model, max_slots, token_budget, block_size):\n"
         "    budget_prefill_chunks(token_budget, 0, [1])\n"
         "    return engine_step(state, model, max_slots, token_budget, block_size)\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(CheckFailed, match=WRITE_IT):
        check_engine_step(main.my_step)
    assert main.budget_prefill_chunks is budget_prefill_chunks


def test_a_refusal_caught_by_the_learners_step_is_still_a_refusal():
    def sneaky(state, model, max_slots, token_budget, block_size):
        try:
            return reference_engine_step(state, model, max_slots, token_budget, block_size)
        except Exception:                                    # noqa: BLE001 - what a learner might write
            return engine_step(state, model, max_slots, token_budget, block_size)
    with pytest.raises(CheckFailed, match=WRITE_IT):
        check_engine_step(sneaky)


def test_mixed_mistakes_get_a_hint_never_an_internal_error():
    slips = ["decodes-forgotten", "no-split", "whole-prompts-only", "jumps-the-queue", "beyond-max-slots",
             "no-block-for-the-first-decode", "newcomers-first", "no-growth", "no-preemption", "oldest-victim",
             "victim-to-the-back", "victim-keeps-its-cache", "a-token-per-chunk", "finished-keep-running",
             "blocks-not-freed", "recomputes-the-prompt-only"]
    rng, refused = random.Random(2), 0
    for _ in range(40):
        first, second = rng.sample(slips, 2)
        calls = []

        def mixed(*args, first=first, second=second, calls=calls):
            calls.append(None)
            return engine_step(*args, slip=first if len(calls) % 3 else second)
        try:                           # (a mixture can be right at every step it took: each slip where harmless)
            check_engine_step(mixed)
        except CheckFailed as refusal:
            assert re.search("Hint: .* Step \\d+ of the workload", str(refusal)), str(refusal)
            refused += 1
    assert refused >= 30


def test_the_write_checker_refuses_the_package_inside_a_helper():
    def helper(*args):
        return reference_paged_write(*args)

    with pytest.raises(CheckFailed, match=WRITE_IT):
        check_paged_write(lambda *args: helper(*args))
    check_paged_write(paged_write)                                     # the notebook's solution passes


def test_the_notebooks_own_solutions_pass(capsys):
    """06's exercise 3 and 06b's exercise 1 as the notebooks write them (its solution cells, run here) pass their checkers."""
    import json
    from pathlib import Path

    import torch

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    cells = {}
    for name in ("06_continuous_batching.ipynb", "06b_chunked_prefill_and_prefix_caching.ipynb"):
        cells.update({c.get("id"): "".join(c["source"]) for c in json.loads((notebooks / name).read_text())["cells"]})
    names = {"torch": torch}
    exec(cells["nb06-ex3-paged-write-solution"], names)
    exec(cells["nb06b-ex1-engine-step-solution"], names)
    check_paged_write(names["paged_write"])
    check_engine_step(names["engine_step"])
    assert capsys.readouterr().out.count("Correct") == 2
