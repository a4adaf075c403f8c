"""Checkers for notebook 07 (putting it together): how gains combine, the memory-bound
ceiling of a decode step, and the fastest configuration that fits a memory budget.

Introduced in notebook 07 (putting it together).
"""

from __future__ import annotations

from ..lab.stack import HF_PEER, best_under_budget
from .grading import Exercise, graded
from . import close_enough, fail, grades_quietly, passed

CUMULATIVE = "cumulative speedup along the ladder"
CEILING = "the memory-bound ceiling of decode throughput"
BUDGET = "the fastest configuration under a memory budget"


def reference_cumulative(rows: list[dict]) -> dict[str, float]:
    """Each stage's speedup over the first: the product of the gains along its chain of
    `builds_on` (a stage on a separate line, such as speculation's, is not in the chain after it).
    Notebook 07 (putting it together)."""
    total: dict[str, float] = {}
    for row in rows:
        total[row["stage"]] = 1.0 if row["builds_on"] is None else total[row["builds_on"]] * row["gain"]
    return total


def _ladders(measured: list[dict] | None) -> list[list[dict]]:
    side_branch = [
        {"stage": "A", "builds_on": None, "gain": None},
        {"stage": "B", "builds_on": "A", "gain": 3.0},
        {"stage": "C", "builds_on": "B", "gain": 0.5},        # does not pay ...
        {"stage": "D", "builds_on": "B", "gain": 2.0},        # ... so D builds on B, not on C
    ]
    straight = [{"stage": "x", "builds_on": None, "gain": None},
                {"stage": "y", "builds_on": "x", "gain": 1.5},
                {"stage": "z", "builds_on": "y", "gain": 4.0}]
    ladders = [side_branch, straight]
    if measured:
        # the first stage and every stage that builds on another (not a peer such as Hugging Face)
        ladders.append([{k: r[k] for k in ("stage", "builds_on", "gain")} for i, r in enumerate(measured)
                        if i == 0 or r["builds_on"] is not None])
    return ladders


def _cumulative_hint(rows: list[dict], got: dict, stage: str, want: dict) -> str:
    """The hint for a wrong speedup of `stage`: the slip its value matches, else the rule."""
    value = float(got[stage])
    row = next(r for r in rows if r["stage"] == stage)
    added: dict[str, float] = {}
    for r in rows:                                    # the same chain, with gains added instead of multiplied
        added[r["stage"]] = 1.0 if r["builds_on"] is None else added[r["builds_on"]] + r["gain"]
    if row["gain"] is not None and close_enough(value, row["gain"], 1e-6):
        return (f"that is {stage!r}'s own gain over {row['builds_on']!r}; multiply it by the speedup of the stage "
                "it builds on.")
    if close_enough(value, added[stage], 1e-6):
        return "speedups multiply along the chain: 3x and then 2x is 6x, not 5x; do not add them."
    if rows[0]["stage"] == "A" and stage == "D" and close_enough(value, 3.0, 1e-6):
        return "D builds on B: multiply B's cumulative speedup by D's own gain."
    return ("gains multiply along the chain of builds_on; a stage on a separate line is not in that chain, and the "
            "stages after it do not include its gain.")


@grades_quietly
@graded(Exercise(title=CUMULATIVE, teaches="each stage's speedup over the first, its gains multiplied along its chain "
                                          "of builds_on"))
def check_cumulative(fn, measured_rows: list[dict] | None = None) -> None:
    """Check `fn(rows) -> {stage: speedup over the first stage}`. Notebook 07 (putting it together)."""
    for rows in _ladders(measured_rows):
        want = reference_cumulative(rows)
        got = fn([dict(r) for r in rows])
        if isinstance(got, dict) and set(got) == set(want) - {rows[0]["stage"]}:
            fail(CUMULATIVE, f"a dict with the stages {sorted(want)}", f"every stage but {rows[0]['stage']!r}",
                 "the first stage belongs in the answer too: its speedup over itself is 1.0.")
        if not isinstance(got, dict) or set(got) != set(want):
            fail(CUMULATIVE, f"a dict with the stages {sorted(want)}", repr(got)[:100],
                 "return one entry per stage, the first stage included (its speedup is 1.0).")
        for stage, value in want.items():
            if not close_enough(float(got[stage]), value, 1e-6):
                fail(CUMULATIVE, f"{value:.4g} for {stage!r}", f"{float(got[stage]):.4g}",
                     _cumulative_hint(rows, got, stage, want))
    passed(CUMULATIVE, "Gains multiply along the chain, and a separate line of stages does not add to it.")


def reference_ceiling(bandwidth_bytes_per_s: float, weight_bytes: float, batch: int = 1) -> float:
    """Decode tokens/s if a step costs only reading every weight once: batch x bandwidth / bytes.
    Notebook 07 (putting it together)."""
    return batch * bandwidth_bytes_per_s / weight_bytes


@grades_quietly
@graded(Exercise(title=CEILING, teaches="the decode throughput of a step that costs only one read of every weight"))
def check_ceiling(fn) -> None:
    """Check `fn(bandwidth_bytes_per_s, weight_bytes, batch) -> tokens/s`.
    Notebook 07 (putting it together)."""
    cases = [(20e9, 538e6, 1), (20e9, 269e6, 1), (3.3e12, 14e9, 1), (20e9, 80e6, 8), (1e12, 1e9, 16)]
    for bandwidth, weights, batch in cases:
        want = reference_ceiling(bandwidth, weights, batch)
        got = fn(bandwidth, weights, batch)
        number = isinstance(got, (int, float)) and not isinstance(got, bool)
        if number and close_enough(float(got), want, 1e-6):
            continue
        hint = "one step reads every weight once and produces one token per row of the batch."
        if not number:
            hint = "return the number of tokens per second, a float."
        elif close_enough(float(got) * batch, want, 1e-6):
            hint = "the weights are read once per step for the whole batch: multiply by the batch size."
        elif close_enough(float(got) * batch * batch, want, 1e-6):
            hint = "the batch shares one read of the weights: multiply by the batch size, do not divide."
        elif close_enough(float(got), want / 8, 1e-6):
            hint = "the sizes are already in bytes; no factor of 8 is needed."
        elif got and any(close_enough(batch ** k / float(got), want, 1e-6) for k in (1, 2)):
            hint = ("weight_bytes / bandwidth is the seconds one step takes; tokens per second is its inverse, "
                    "times the batch.")
        fail(CEILING, f"{want:.4g} tokens/s for {bandwidth:.3g} B/s, {weights:.3g} B, batch {batch}",
             got if not isinstance(got, float) else f"{got:.4g}", hint)
    passed(CEILING, "At batch 1, fewer bytes per weight raise the ceiling in proportion.")


# --- the fastest configuration under a memory budget ------------------------------------

def reference_best_under_budget(rows: list[dict], budget_bytes: float) -> str | None:
    """The reference of exercise 3: `stack.best_under_budget`. Notebook 07 (putting it together)."""
    return best_under_budget(rows, budget_bytes)


def _budget_rows() -> list[dict]:
    """A made-up ladder in which every typical slip picks another stage for some budget."""
    def row(stage, tokens_per_s, gain, weight_bytes, kv_cache_bytes):
        return {"stage": stage, "tokens_per_s": tokens_per_s, "gain": gain, "weight_bytes": weight_bytes,
                "kv_cache_bytes": kv_cache_bytes}
    return [row("naive loop", 2.0, None, 500, 0), row("+ KV cache", 10.0, 5.0, 500, 40),
            row("+ static batching", 30.0, 3.0, 500, 320), row("+ bf16", 36.0, 1.2, 250, 160),
            row("+ int4 weights", 27.0, 0.75, 80, 160), row("+ int4, batch 1", 14.0, 1.4, 80, 20),
            row("+ speculative decoding", 21.0, 1.5, 80, 20), row("+ continuous batching", 33.0, 1.22, 80, 300)]


def _budget_slips(rows: list[dict], budget: float) -> list[tuple[object, str]]:
    """(what each typical slip answers, its hint) for one budget."""
    ours = [r for r in rows if r.get("weight_bytes") is not None]
    memory = {r["stage"]: r["weight_bytes"] + r["kv_cache_bytes"] for r in ours}
    fits = [r for r in ours if memory[r["stage"]] <= budget]

    def fastest(candidates, key="tokens_per_s"):
        candidates = [r for r in candidates if r[key] is not None]
        return max(candidates, key=lambda r: r[key])["stage"] if candidates else None
    return [
        (fastest(ours), "a stage that does not fit the budget cannot be deployed: keep only the stages whose "
                        "weight_bytes + kv_cache_bytes are at most the budget."),
        (fastest([r for r in ours if r["weight_bytes"] <= budget]),
         "the KV cache needs memory too: a stage needs weight_bytes + kv_cache_bytes."),
        (fastest([r for r in ours if memory[r["stage"]] < budget]),
         "a stage that needs exactly the budget still fits: compare with <=, not <."),
        (min(fits, key=lambda r: memory[r["stage"]])["stage"] if fits else None,
         "among the stages that fit, pick the fastest (highest tokens_per_s), not the smallest."),
        (fastest(fits, key="gain"), "compare tokens_per_s, not gain: each gain is over a different stage."),
    ]


@grades_quietly
@graded(Exercise(title=BUDGET, teaches="the choice of the fastest stage whose weights and KV cache fit a memory "
                                      "budget"))
def check_best_under_budget(fn, measured_rows: list[dict] | None = None) -> None:
    """Check `fn(rows, budget_bytes) -> the name of the fastest stage that fits, or None`.

    Introduced in notebook 07 (putting it together). measured_rows: `run_stack`'s rows; every
    stage's own memory is then a budget too (it must fit exactly), and one less than the smallest.
    """
    made_up = _budget_rows()
    cases = [(made_up, budget) for budget in (1000, 200, 240, 50, 410, 100)]
    if measured_rows:
        ours = [r for r in measured_rows if r.get("weight_bytes") is not None]
        sizes = sorted({r["weight_bytes"] + r["kv_cache_bytes"] for r in ours})
        cases += [(measured_rows, size) for size in sizes] + ([(measured_rows, sizes[0] - 1)] if sizes else [])
    peer = {"stage": HF_PEER, "tokens_per_s": 99.0, "gain": None, "weight_bytes": None, "kv_cache_bytes": None}
    cases.append((made_up + [peer], 1000))
    for rows, budget in cases:
        want = reference_best_under_budget(rows, budget)
        case = f"budget {budget:,} bytes" + (", with a Hugging Face row" if any(r is peer for r in rows) else "")
        try:
            got = fn([dict(r) for r in rows], budget)
        except (TypeError, ValueError, KeyError) as error:
            if want is None:
                hint = "when no stage fits the budget, return None (max() of nothing raises an error)."
            elif any(r.get("weight_bytes") is None for r in rows):
                hint = ("rows without weight_bytes (a peer such as Hugging Face generate()) are not "
                        "configurations of ours: skip them.")
            else:
                hint = "each row has tokens_per_s, weight_bytes and kv_cache_bytes; return the stage's name."
            fail(BUDGET, repr(want), f"an error: {str(error)[:60]}", f"{hint} Case: {case}")
        if got == want:
            continue
        if isinstance(got, dict) and got.get("stage") == want:
            hint = "return the stage's name (row[\"stage\"]), not the whole row."
        elif want is None:
            hint = "when no stage fits the budget, return None."
        else:
            hint = next((h for answer, h in _budget_slips(rows, budget) if answer == got and answer != want),
                        "keep the stages whose weight_bytes + kv_cache_bytes fit the budget, then take the one "
                        "with the highest tokens_per_s.")
        fail(BUDGET, repr(want), repr(got)[:80], f"{hint} Case: {case}")
    passed(BUDGET, "Under a tight budget, the stages that read fewer bytes are the ones that fit.")
