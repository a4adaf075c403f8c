"""Was the machine quiet while it measured? The guard in front of every verdict.

Introduced in notebook 00 (where the time goes). A verdict drawn from a disturbed
measurement is not true either: a browser, an indexer or another notebook running at
the same time can make batch 2 look slower than batch 8. Two signs that a run was
disturbed, both cheap:

* the spread of a figure's repeats: when the middle half of the runs (the interquartile
  range of `measure.Timing`) spans more than a quarter of the median, one figure
  changed under the measurement;
* the load probe: the 1-minute load average of the operating system, per usable core.
  The measurement itself keeps every core busy (load about 1 per core); well above
  that, other programs were competing for the cores.

A figure timed once has no spread, and a sweep's load can come and go between its
points. One more sign is then cheap and certain: more work never takes much less time.
`more_work_faster_reason` finds a larger batch, or a longer sequence, that took under
half the time of a smaller one (notebooks 00, 01 and 02 apply it to their sweeps).

`busy_reason` turns both into one sentence (or None when the run looks quiet), and
`judge` puts `BUSY_VERDICT` in place of a verdict when there is a reason.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Mapping, Sequence

from ..errors import LabError
from .measure import Timing

BUSY_VERDICT = "the machine was busy: re-run for a verdict"
FASTER_LIMIT = 0.5         # more work in under half the time of less work: the machine was busy
SPREAD_LIMIT = 0.25        # interquartile range / median above which a figure is not trusted
LOAD_LIMIT = 1.5           # load average per usable core above which the machine was shared


def relative_spread(timing: Timing | Mapping) -> float:
    """How much a figure's repeats disagree, as a fraction of their median.

    Introduced in notebook 00 (where the time goes). Takes a `measure.Timing`, or its
    `to_dict()` (a mapping with "median" and "spread"), as the benchmarks store them.
    """
    if isinstance(timing, Timing):
        median, spread = timing.median, timing.spread
    elif isinstance(timing, Mapping) and "median" in timing and "spread" in timing:
        median, spread = float(timing["median"]), float(timing["spread"])
    else:
        raise LabError(f"relative_spread takes a measure.Timing or its to_dict(), not {type(timing).__name__}.")
    return spread / median if median > 0 else 0.0


def usable_cores() -> int:
    """The number of cores this process may run on (its affinity where the OS tells it).

    Introduced in notebook 00 (where the time goes).
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):        # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def load_per_core() -> float | None:
    """The operating system's 1-minute load average per usable core; None where there is none (Windows).

    Introduced in notebook 00 (where the time goes).
    """
    try:
        return os.getloadavg()[0] / usable_cores()
    except (AttributeError, OSError):
        return None


def busy_reason(timings: Mapping[str, Timing | Mapping] | Iterable = (), load: float | None = None,
                spread_limit: float = SPREAD_LIMIT, load_limit: float = LOAD_LIMIT) -> str | None:
    """One sentence saying why this run's figures cannot carry a verdict, or None if it looked quiet.

    Introduced in notebook 00 (where the time goes). timings: the figures behind a
    verdict, as {name: Timing or Timing.to_dict()} (or a plain list of them). load: the
    load average per core measured with them (`load_per_core()`); None skips the probe.
    """
    if not isinstance(timings, Mapping):
        timings = {f"figure {i + 1}": t for i, t in enumerate(timings)}
    spreads = {name: relative_spread(t) for name, t in timings.items()}
    reasons = []
    if load is not None and load > load_limit:
        reasons.append(f"the load average was {load:.1f} per core (the measurement alone gives about 1)")
    worst = max(spreads, key=spreads.get, default=None)
    if worst is not None and spreads[worst] > spread_limit:
        reasons.append(f"the repeats of {worst} disagree by {spreads[worst]:.0%} of their median")
    return "; ".join(reasons) or None


def more_work_faster_reason(points: Sequence[tuple[float, float]], name: Callable[[float], str],
                            limit: float = FASTER_LIMIT) -> str | None:
    """One sentence when more work took far less time, else None.

    Introduced in notebook 00 (where the time goes); notebooks 01 and 02 use it too.
    points: (size of the work, seconds), e.g. (batch, seconds per step) or (tokens in the
    sequence, seconds per step); the time of a larger size should never fall under
    `limit` x the time of a smaller one. name(size) words a size, e.g. ``lambda b: f"batch {b}"``.
    """
    points = sorted(points)
    for i, (small, small_s) in enumerate(points):
        for large, large_s in points[i + 1:]:
            if large > small and small_s > 0 and large_s < limit * small_s:
                return (f"a step at {name(large)} took {1 - large_s / small_s:.0%} less time than at "
                        f"{name(small)}, though it does more work")
    return None


def judge(verdict: str, reason: str | None) -> str:
    """`verdict` when the run was quiet (reason None), else BUSY_VERDICT with the reason.

    Introduced in notebook 00 (where the time goes).
    """
    return verdict if reason is None else f"{BUSY_VERDICT} ({reason})"
