"""The tour's progress bars (lab/progress.py, bench/suite.py): what is timed is named, the
estimate comes from the last run here or the reference machine, and it grows when exceeded."""

from __future__ import annotations

import time

from labsupport.bench.suite import REFERENCE_SECONDS, SECTIONS, _estimate
from labsupport.lab import progress
from labsupport.lab.measure import time_side_by_side


def test_a_section_bar_names_what_is_timed_and_ends_at_the_time_taken(capsys):
    with progress.section_bar("kv_cache", 1, "estimate: a 2-core CPU") as bar:
        time_side_by_side({"cached": lambda: None, "uncached": lambda: None}, "cpu", warmup=1, repeats=2)
        assert "uncached" in bar.postfix or "cached" in bar.postfix
        time.sleep(2.3)                                   # past the estimate: the estimate grows
        assert bar.total >= 2
    out = capsys.readouterr().out
    assert "kv_cache (estimate: a 2-core CPU)" in out and "done" in out
    assert bar.n == bar.total and 2 <= bar.total <= 4
    progress.timing("nothing drawn outside a bar")         # no bar: a no-op, not an error


def test_the_estimate_is_this_machines_last_run_else_the_reference():
    previous = {"sections": {"batching": {"seconds": 42.5}, "stack": {"seconds": "?"}}}
    assert _estimate("batching", previous) == (42.5, "estimate: its last run here")
    assert _estimate("stack", previous) == (REFERENCE_SECONDS["stack"], "estimate: a 2-core CPU")
    assert _estimate("serving", None)[0] == REFERENCE_SECONDS["serving"]
    assert set(REFERENCE_SECONDS) == set(SECTIONS)        # every section has a reference figure


def test_an_estimate_that_is_not_a_positive_number_starts_at_one_second(capsys):
    for expected in (0, -5, float("nan"), float("inf")):
        with progress.section_bar("roofline", expected) as bar:
            assert bar.total == 1
    for seconds in (0, -3.0, float("nan"), float("inf"), True, "12"):
        assert _estimate("batching", {"sections": {"batching": {"seconds": seconds}}})[1] == "estimate: a 2-core CPU"
