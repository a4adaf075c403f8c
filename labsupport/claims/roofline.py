"""The handbook chapter's claims of notebook 00 (where the time goes), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested.
Before any verdict, `sweep_busy_reason` asks whether the sweep was measured on a quiet
machine; where it was not, every verdict says so instead of judging (`busy.judge`)."""

from __future__ import annotations

import math

from ..lab.busy import BUSY_VERDICT, busy_reason, judge, more_work_faster_reason
from ..errors import LabError
from ..lab.roofs import HardwareProfile
from ..lab.roofline import OVERHEAD_SLACK, roof_fraction

FREE_ROWS_LIMIT = 1.5  # "extra rows are nearly free": 4 rows take under 1.5x the time of 1
GROWTH_LIMIT = 0.5     # "compute-bound": past the ridge, time grows at least as batch^0.5


def _nearest_row(rows: list[dict], batch: int) -> dict:
    """The measured row whose batch is closest to `batch`."""
    return min(rows, key=lambda r: abs(r["batch"] - batch))


def falling_time_reason(rows: list[dict]) -> str | None:
    """Why a sweep whose step time falls steeply as the batch grows cannot be trusted, or None.

    Introduced in notebook 00 (where the time goes). A step with more rows does at least
    the same work, so a larger batch that takes under half the time of a smaller batch of
    the same dtype means the smaller one was slowed down by something else: another
    program took the cores while it was timed (`busy.more_work_faster_reason`, per dtype).
    """
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        reason = more_work_faster_reason([(r["batch"], r["seconds"]) for r in rows if r["dtype"] == dtype],
                                         lambda batch: f"{dtype} batch {batch:.0f}")
        if reason:
            return reason
    return None


def sweep_busy_reason(rows: list[dict], load: float | None = None) -> str | None:
    """One sentence saying why a decode sweep cannot carry a verdict, or None if it looks quiet.

    Introduced in notebook 00 (where the time goes). Three signs, any one enough: the
    repeats of a point disagree (its "timing" spread, `busy.busy_reason`), the load
    average per core was high (`load`, from `busy.load_per_core()`; None skips it), or
    the step time falls steeply as the batch grows (`falling_time_reason`).
    """
    timings = {f"{r['dtype']} batch {r['batch']}": r["timing"] for r in rows if "timing" in r}
    reasons = [busy_reason(timings, load=load), falling_time_reason(rows)]
    return "; ".join(r for r in reasons if r) or None


def _growth(a: dict, b: dict) -> float:
    """The exponent p in time ~ batch^p between two measured rows."""
    return math.log(b["seconds"] / a["seconds"]) / math.log(b["batch"] / a["batch"])


def roofline_claims(rows: list[dict], profile: HardwareProfile, load: float | None = None) -> list[dict]:
    """The handbook chapter's claims about batching, each set against one dtype's decode sweep.

    Introduced in notebook 00 (where the time goes). Returns dicts with claim, dtype,
    measured (a sentence with the numbers) and verdict. The thresholds:

    * "a small batch is memory-bandwidth-bound" holds when batch 1's intensity is below
      the ridge, 4 rows take under 1.5x the time of one (extra rows nearly free), and
      batch 1 runs within 2x (`roofline.OVERHEAD_SLACK`) of the memory roof's time;
    * "a large batch is compute-bound" is judged only past the predicted ridge (intensity
      above `profile.ridge`): it holds when, there, the time grows at least as batch^0.5
      and the largest batch runs within 2x of the roofline's time (else overheads, not the
      arithmetic, set its pace: `roofline.step_bounds` calls it "overhead-bound"). A rise
      of the time below the ridge (on a CPU, the switch from a matrix-vector to a
      matrix-matrix kernel at batch 2) is not the roofline crossing and is not counted;
    * "batch 1 -> 16 gives 10-15x the throughput" holds from 10x.

    Every verdict goes through `busy.judge`: when `sweep_busy_reason(rows, load)` finds
    the machine was busy, it reads "the machine was busy: re-run for a verdict (why)".
    """
    if not rows:
        raise LabError("roofline_claims needs the rows of a decode sweep (roofline.sweep_decode); it got none.")
    rows = sorted(rows, key=lambda r: r["batch"])
    name, ridge = rows[0]["dtype"], profile.ridge(rows[0]["dtype"])
    reason = sweep_busy_reason(rows, load)
    first, small, last, sixteen = rows[0], _nearest_row(rows, 4), rows[-1], _nearest_row(rows, 16)

    small_ratio = small["seconds"] / first["seconds"]
    if first["intensity"] >= ridge:
        small_verdict = "does not hold: batch 1 is already past the ridge here"
    elif small_ratio >= FREE_ROWS_LIMIT:
        small_verdict = "partly: below the ridge, but extra rows are not free here"
    elif roof_fraction(first, profile) < 1 / OVERHEAD_SLACK:
        small_verdict = (f"partly: below the ridge and extra rows are nearly free, but batch 1 runs at "
                         f"{roof_fraction(first, profile):.0%} of the memory roof: overheads set its pace")
    else:
        small_verdict = "holds"

    past = [r for r in rows if r["intensity"] > ridge]
    if not past:
        large_measured = (f"largest batch {last['batch']}: {last['intensity']:.1f} FLOP/B, below the ridge "
                          f"({ridge:.1f} FLOP/B)")
        large_verdict = "not reached in this sweep"
    else:
        start = past[0] if len(past) > 1 else rows[rows.index(past[0]) - 1]
        growth = _growth(start, last) if start is not last else float("nan")
        large_measured = (f"past the ridge ({ridge:.1f} FLOP/B) from batch {past[0]['batch']}; batch "
                          f"{last['batch']}: {last['intensity']:.1f} FLOP/B, {roof_fraction(last, profile):.0%} "
                          f"of the roofline; time grows as batch^{growth:.2f} from {start['batch']} to {last['batch']}")
        if not growth >= GROWTH_LIMIT:
            large_verdict = "partly: past the ridge, but the time per step still grows slower than the batch"
        elif roof_fraction(last, profile) < 1 / OVERHEAD_SLACK:
            large_verdict = (f"partly: past the ridge and the time grows with the batch, but at "
                             f"{roof_fraction(last, profile):.0%} of the roofline overheads set its pace")
        else:
            large_verdict = "holds"

    speedup = sixteen["tokens_per_s"] / first["tokens_per_s"]
    return [
        {"claim": "a small batch is memory-bandwidth-bound", "dtype": name,
         "measured": f"batch 1: {first['intensity']:.1f} FLOP/B (ridge {ridge:.1f}), "
                     f"{first['bytes_per_s'] / 1e9:.1f} GB/s = {first['bytes_per_s'] / profile.bandwidth:.0%} of copy "
                     f"bandwidth; {small['batch']} rows take {small_ratio:.2f}x the time of 1",
         "verdict": judge(small_verdict, reason)},
        {"claim": "a large batch is compute-bound", "dtype": name, "measured": large_measured,
         "verdict": judge(large_verdict, reason)},
        {"claim": "batch 1 -> 16 gives 10-15x the throughput", "dtype": name,
         "measured": f"batch 1 -> {sixteen['batch']}: {speedup:.1f}x "
                     f"({first['tokens_per_s']:.0f} -> {sixteen['tokens_per_s']:.0f} tokens/s)",
         "verdict": judge("holds" if speedup >= 10 else "less here", reason)},
    ]


def claims_summary(claims: list[dict]) -> str:
    """One paragraph saying what this run made of the chapter's claims, built from `roofline_claims`' verdicts.

    Introduced in notebook 00 (where the time goes). Each claim is listed with its
    verdict per dtype, one sentence each; the opening says whether all held, some did, or
    the machine was too busy for a verdict (and why, once, one sentence per reason).
    """
    if not claims:
        return "No claim was set against a measurement in this run."
    busy_prefix = f"{BUSY_VERDICT} ("
    reasons = []                          # each sentence once, though several claims and dtypes repeat it
    for claim in claims:
        if claim["verdict"].startswith(busy_prefix):
            reasons += [r for r in claim["verdict"][len(busy_prefix):-1].split("; ") if r not in reasons]
    verdicts: dict[str, list[str]] = {}
    for claim in claims:
        verdict = "no verdict (busy machine)" if claim["verdict"].startswith(BUSY_VERDICT) else claim["verdict"]
        verdicts.setdefault(claim["claim"], []).append(f"{verdict} ({claim['dtype']})")
    judged = [c for c in claims if not c["verdict"].startswith(BUSY_VERDICT)]
    if reasons:
        why = " ".join(f"{reason[:1].upper()}{reason[1:]}." for reason in reasons)
        opening = (f"The machine was busy while some of the sweep was measured. {why} Those figures get no "
                   "verdict: re-run the sweep on a quiet machine")
    elif all(c["verdict"] == "holds" for c in judged):
        opening = "In this run every one of the chapter's claims holds"
    elif any(c["verdict"] == "holds" for c in judged):
        opening = "In this run the chapter's claims hold only in part"
    else:
        opening = "In this run none of the chapter's claims holds as stated"
    details = " ".join(f"\u201c{claim}\u201d: {verdict}." for claim, found in verdicts.items() for verdict in found)
    return f"{opening}. {details}"


def roofline_section_claims(section: dict) -> list[dict]:
    """The roofline bench section's claims: `roofline_claims` of each dtype's sweep, from the
    section's dict (its ``sweeps``, ``hardware`` and the suite's ``load_per_core``).

    Introduced in notebook 00 (where the time goes)."""
    profile = HardwareProfile(**section["hardware"])
    return [claim for rows in section["sweeps"].values()
            for claim in roofline_claims(rows, profile, load=section.get("load_per_core"))]
