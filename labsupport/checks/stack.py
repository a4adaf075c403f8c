"""Checkers for notebook 07 (putting it together): how gains combine, and the
memory-bound ceiling of a decode step.

Introduced in notebook 07 (putting it together).
"""

from __future__ import annotations

from . import close_enough, fail, passed

CUMULATIVE = "cumulative speedup along the ladder"
CEILING = "the memory-bound ceiling of decode throughput"


def reference_cumulative(rows: list[dict]) -> dict[str, float]:
    """Each stage's speedup over the first: the product of the gains along its chain of
    `builds_on` (a stage that did not pay is a side branch: nothing builds on it).
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


def check_cumulative(fn, measured_rows: list[dict] | None = None) -> None:
    """Check `fn(rows) -> {stage: speedup over the first stage}`. Notebook 07 (putting it together)."""
    for rows in _ladders(measured_rows):
        want = reference_cumulative(rows)
        got = fn([dict(r) for r in rows])
        if not isinstance(got, dict) or set(got) != set(want):
            fail(CUMULATIVE, f"a dict with the stages {sorted(want)}", repr(got)[:100],
                 "return one entry per stage, the first stage included (its speedup is 1.0).")
        for stage, value in want.items():
            if not close_enough(float(got[stage]), value, 1e-6):
                hint = ("gains multiply along the chain of builds_on; a stage that did not pay is a side "
                        "branch, and the stages after it do not include its gain.")
                if rows[0]["stage"] == "A" and stage == "D" and close_enough(float(got[stage]), 3.0, 1e-6):
                    hint = "D builds on B: multiply B's cumulative speedup by D's own gain."
                fail(CUMULATIVE, f"{value:.4g} for {stage!r}", f"{float(got[stage]):.4g}", hint)
    passed(CUMULATIVE, "Gains multiply along the chain, and side branches do not compound.")


def reference_ceiling(bandwidth_bytes_per_s: float, weight_bytes: float, batch: int = 1) -> float:
    """Decode tokens/s if a step costs only reading every weight once: batch x bandwidth / bytes.
    Notebook 07 (putting it together)."""
    return batch * bandwidth_bytes_per_s / weight_bytes


def check_ceiling(fn) -> None:
    """Check `fn(bandwidth_bytes_per_s, weight_bytes, batch) -> tokens/s`.
    Notebook 07 (putting it together)."""
    cases = [(20e9, 538e6, 1), (20e9, 269e6, 1), (3.3e12, 14e9, 1), (20e9, 80e6, 8), (1e12, 1e9, 16)]
    for bandwidth, weights, batch in cases:
        want = reference_ceiling(bandwidth, weights, batch)
        got = fn(bandwidth, weights, batch)
        if not isinstance(got, (int, float)) or not close_enough(float(got), want, 1e-6):
            hint = "one step reads every weight once and produces one token per row of the batch."
            if isinstance(got, (int, float)) and close_enough(float(got) * batch, want, 1e-6):
                hint = "the weights are read once per step for the whole batch: multiply by the batch size."
            elif isinstance(got, (int, float)) and close_enough(float(got), want / 8, 1e-6):
                hint = "the sizes are already in bytes; no factor of 8 is needed."
            fail(CEILING, f"{want:.4g} tokens/s for {bandwidth:.3g} B/s, {weights:.3g} B, batch {batch}",
                 got if not isinstance(got, float) else f"{got:.4g}", hint)
    passed(CEILING, "At batch 1, fewer bytes per weight raise the ceiling in proportion.")
