"""Checker for notebook 10 (past one device), exercise 3 (warm-up): the goodput of a trace.

Introduced in notebook 10 (past one device).

* `check_goodput`: the requests that met both objectives (TTFT at most ttft_slo and TPOT at most
  tpot_slo, equal counts as met) per second of the trace's span, from 0 (the first arrival) to the
  last "finished". It runs the learner's function on made-up traces, compares with the checker's
  own `reference_goodput`, and names the usual slips (either objective, throughput, the share, <,
  a span from the first finish, from the last row, or summed over the requests, a dict). It grades
  by reach (`grading.graded`): a function that reaches the package's goodput
  (`labsupport.lab.serving_metrics.goodput`) or this module's reference or slips is refused.

The module is apart from `checks.tensor_parallel`, whose checkers fill its 400 lines; notebook 10
imports `check_goodput` from here.
"""

from __future__ import annotations

import copy
import numbers

from . import call_learner, close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded

GOODPUT = "the goodput of a trace"
GOODPUT_EXERCISE = Exercise(title=GOODPUT, teaches="the goodput of a trace: the requests that met both objectives per "
                                                   "second of the trace's span")


def _row(ttft, tpot, finished, tokens=6) -> dict:
    return {"tokens": list(range(100, 100 + tokens)), "ttft": ttft, "tpot": tpot, "finished": finished}


def _made_up(seed: int = 10, n: int = 12) -> list[dict]:
    """A Poisson-like trace of n requests, in order of arrival (not of finish), to the millisecond."""
    state, rows, arrival = seed, [], 0.0
    for index in range(n):
        draws = []
        for _ in range(4):
            state = (1103515245 * state + 12345) % 2**31                    # the same numbers everywhere
            draws.append(state / 2**31)
        ttft, tpot, tokens = round(0.2 + 1.6 * draws[0], 3), round(0.05 + 0.2 * draws[1], 3), 4 + int(20 * draws[2])
        rows.append(_row(ttft, tpot, round(arrival + ttft + tpot * (tokens - 1), 3), tokens))
        arrival = round(arrival + 0.8 * draws[3], 3) if index < n - 1 else arrival
    return rows


# (what the trace shows, rows, ttft_slo, tpot_slo): every row's "finished" differs, and no trace is in order of finish
TRACES = [
    ("7 requests, some meeting one objective only, one exactly at both",
     [_row(0.5, 0.1, 4.0), _row(1.0, 0.125, 2.5), _row(0.25, 0.3, 6.0), _row(2.0, 0.05, 5.0),
      _row(3.0, 0.5, 8.0, 12), _row(0.75, 0.0625, 7.0, 9), _row(0.125, 0.25, 3.0, 3)], 1.0, 0.125),
    ("3 requests, none meeting both objectives", [_row(0.75, 0.05, 3.0), _row(0.25, 0.2, 5.0, 14),
                                                   _row(1.5, 0.15, 4.0)], 0.5, 0.1),
    ("4 requests, three of them exactly at an objective", [_row(0.5, 0.0625, 2.0), _row(0.5, 0.03125, 3.0, 10),
                                                            _row(0.25, 0.0625, 1.5, 4), _row(0.375, 0.05, 2.5)],
     0.5, 0.0625),
    ("12 requests arriving about 2.5 per second", _made_up(), 1.0, 0.15),
]


def reference_goodput(rows, ttft_slo, tpot_slo) -> float:
    """Requests per second that met both objectives (ttft <= ttft_slo and tpot <= tpot_slo) over the trace's span,
    from 0 to the largest "finished" (`lab.serving_metrics.goodput`, the course's one goodput).
    Notebook 10 (past one device), exercise 3."""
    from ..lab.serving_metrics import goodput
    return goodput(rows, ttft_slo, tpot_slo)["goodput"]


def _slip(meets=lambda r, a, b: r["ttft"] <= a and r["tpot"] <= b, per=lambda rows: max(r["finished"] for r in rows)):
    """The goodput with one slip: which requests count, or what they are divided by."""
    return lambda rows, a, b: sum(bool(meets(r, a, b)) for r in rows) / per(rows)


SPAN = "the span is one stretch of time, from 0 (the first arrival) to the largest finished"
DURATIONS = (f"the requests overlap in time, so adding up their durations counts the same seconds many times: {SPAN}.")
SLIPS = [
    (_slip(lambda r, a, b: r["ttft"] <= a or r["tpot"] <= b),
     "a request is served well only when it meets both objectives: ttft <= ttft_slo and tpot <= tpot_slo, not or."),
    (_slip(lambda r, a, b: True), "that is the throughput, every request per second: count only the requests that "
                                  "met both objectives."),
    (_slip(per=len), "that is the share of the requests that met both, not a rate: divide their number by the "
                     "trace's span in seconds, max of finished, not by the number of requests."),
    (_slip(per=lambda rows: 1.0), "that is how many requests met both: divide by the trace's span, max of finished, "
                                  "for requests per second."),
    (_slip(lambda r, a, b: r["ttft"] < a and r["tpot"] < b), "exactly at the objective counts as met: compare with "
                                                             "<=, not <."),
    (_slip(lambda r, a, b: r["ttft"] <= a), "a request must keep its pace too: count it only when its tpot is at "
                                            "most tpot_slo as well as its ttft at most ttft_slo."),
    (_slip(lambda r, a, b: r["tpot"] <= b), "a request must get its first token on time too: count it only when "
                                            "its ttft is at most ttft_slo as well as its tpot at most tpot_slo."),
    (_slip(lambda r, a, b: r["ttft"] <= b and r["tpot"] <= a), "compare each row's ttft with ttft_slo and its tpot "
                                                               "with tpot_slo (the arguments come in that order)."),
    (_slip(per=lambda rows: max(r["finished"] for r in rows) - min(r["finished"] for r in rows)),
     "the trace starts at 0, the first arrival, not at the first finish: the span is the largest finished, with "
     "nothing subtracted."),
    (_slip(per=lambda rows: rows[-1]["finished"]), "the rows are in order of arrival, not of finish: the span ends "
                                                   "at the largest finished, max(r[\"finished\"] for r in rows)."),
    (_slip(per=lambda rows: sum(r["finished"] for r in rows)), DURATIONS),
    (_slip(per=lambda rows: sum(r["ttft"] + r["tpot"] * (len(r["tokens"]) - 1) for r in rows)), DURATIONS),
    (_slip(per=lambda rows: sum(r["ttft"] + r["tpot"] for r in rows)), DURATIONS),
]
RULE = ("count the requests with ttft <= ttft_slo and tpot <= tpot_slo, and divide by the trace's span, "
        "max(r[\"finished\"] for r in rows).")


def _matches(got: float, slip, trace) -> bool:
    try:
        return close_enough(got, slip(*trace[1:]), rel=1e-9)
    except ZeroDivisionError:
        return False


def _hint(got: list[float], index: int) -> str:
    """The slip whose values are all of `got`, else the slip that gives got[index] there, else the rule."""
    everywhere = [h for s, h in SLIPS if all(_matches(g, s, t) for g, t in zip(got, TRACES))]
    there = [h for s, h in SLIPS if _matches(got[index], s, TRACES[index])]
    return (everywhere or there or [RULE])[0]


def _error_hint(error: Exception) -> str:
    if isinstance(error, KeyError):
        return 'each row is a dict with "ttft", "tpot" and "finished" (seconds): read them as row["ttft"] and so on.'
    if isinstance(error, ZeroDivisionError):
        return f"divide by the trace's span, which is never 0 here: {SPAN}."
    return RULE[0].upper() + RULE[1:]


@grades_quietly
@graded(GOODPUT_EXERCISE)
def check_goodput(fn) -> None:
    """Check `fn(rows, ttft_slo, tpot_slo)` -> requests per second that met both objectives. Notebook 10 (past one
    device), exercise 3. Exact (to 1e-9) on four made-up traces (none met, ties at the objectives, rows not in
    order of finish), with a hint for each usual slip; a function that reaches the package's goodput
    (`lab.serving_metrics.goodput`) is refused (`GOODPUT_EXERCISE`)."""
    got = []
    for about, rows, ttft_slo, tpot_slo in TRACES:
        case = f"{about}, ttft_slo={ttft_slo:g} s, tpot_slo={tpot_slo:g} s"
        value = call_learner(GOODPUT, f"requests per second ({case})", _error_hint, fn, copy.deepcopy(rows),
                             ttft_slo, tpot_slo)
        if isinstance(value, dict):
            fail(GOODPUT, f"a number of requests per second ({case})", f"a dict with keys {sorted(value)}"[:80],
                 "return the goodput alone, a number of requests per second, not a dict.")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            fail(GOODPUT, f"a number of requests per second ({case})", repr(value)[:60],
                 "return the goodput as a number (a float), the requests that met both per second of the span.")
        got.append(float(value))
    for index, (trace, value) in enumerate(zip(TRACES, got)):
        want = reference_goodput(*trace[1:])
        if not close_enough(value, want, rel=1e-9):
            fail(GOODPUT, f"{want:.6g} requests/s ({trace[0]}, ttft_slo={trace[2]:g} s, tpot_slo={trace[3]:g} s)",
                 f"{value:.6g}", _hint(got, index))
    rows, ttft_slo, tpot_slo = TRACES[0][1:]
    served = len(rows) / max(r["finished"] for r in rows)
    passed(GOODPUT, f"Throughput counts every request served; goodput counts only the ones a user would call served "
                    f"well, first token and pace both on time, per second: {reference_goodput(*TRACES[0][1:]):.3g} "
                    f"of {served:.3g} requests/s on the first trace.")

