"""Each notebook's run time under nbval, summed over its cells and printed at the end of the run,
so that every CI run (a clean clone, empty caches) measures what the README's table reports."""

from __future__ import annotations

from collections import defaultdict

_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration            # setup, call and teardown of every cell


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section("notebook run times (nbval, every cell)")
    for path, seconds in sorted(_seconds.items()):
        terminalreporter.write_line(f"{path}: {seconds:.0f} s")
    terminalreporter.write_line(f"all notebooks: {sum(_seconds.values()) / 60:.1f} min")
