"""A progress bar per section of a long run (`python -m labsupport tour` and `bench`): what is
being timed now, and about how long the section has left.

Introduced in notebook 00 (where the time goes; the tour measures every notebook's section).

The time left is an estimate: each section's bar runs in seconds towards the time the section
took on this machine the last time (the previous report in the output folder), else towards
the time it took on the course's reference machine (a quiet 2-core x86 CPU, `suite.SECTIONS`).
A second thread moves the bar on once a second; `timing(name)`, which `measure.time_side_by_side`
calls before each candidate it runs, names what is being timed. Outside a `section_bar` block
(a notebook calling the package) nothing is drawn. The bars go to standard output, beside the
report's table, so that standard error holds only a mistake's one sentence.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from tqdm.auto import tqdm

_bar: tqdm | None = None                  # the running section's bar (sections run one at a time)


def timing(what: str) -> None:
    """Name what the running section times now (shown beside its bar). Notebook 00."""
    if _bar is not None:
        _bar.set_postfix_str(what[:48], refresh=False)


def _advance(bar: tqdm, start: float) -> None:
    """Move the bar to the seconds elapsed; past the estimate, the estimate grows (10% ahead)."""
    elapsed = time.perf_counter() - start
    if elapsed >= bar.total:
        bar.total = round(elapsed * 1.1) + 1
    bar.update(int(elapsed) - bar.n)


@contextlib.contextmanager
def section_bar(name: str, expected_s: float, label: str = "estimated"):
    """A bar for the block that runs section `name`, expected to take `expected_s` seconds.

    Notebook 00 (where the time goes). label: where the estimate comes from, shown in the bar
    ("last run here", "2-core reference"). The bar ends full, at the seconds actually taken.
    An estimate that is not a positive, finite number of seconds starts the bar at 1 s.
    """
    global _bar
    expected = expected_s if isinstance(expected_s, (int, float)) and 0 < expected_s < float("inf") else 1
    bar = tqdm(total=max(1, round(expected)), desc=f"{name} ({label})", unit="s", leave=True, file=sys.stdout,
               bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n}/{total} s, about {remaining} left{postfix}")
    start, done = time.perf_counter(), threading.Event()

    def tick():
        while not done.wait(1.0):
            _advance(bar, start)

    ticker = threading.Thread(target=tick, name=f"progress-{name}", daemon=True)
    _bar = bar
    ticker.start()
    try:
        yield bar
    finally:
        done.set()
        ticker.join()
        _bar = None
        bar.total = bar.n = max(1, round(time.perf_counter() - start))
        bar.set_postfix_str("done", refresh=False)
        bar.close()                                  # draws the finished bar once
