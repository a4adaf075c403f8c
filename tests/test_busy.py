"""labsupport.lab.busy: the guard that keeps a verdict from a disturbed measurement."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT, busy_reason, judge, load_per_core, relative_spread
from labsupport.errors import LabError
from labsupport.lab.measure import Timing

QUIET = Timing([1.00, 1.01, 1.02, 0.99, 1.00])
NOISY = Timing([1.0, 2.5, 1.1, 2.4, 1.0])       # a browser woke up in the middle


def test_relative_spread_of_a_timing_and_of_its_dict():
    assert relative_spread(QUIET) < 0.05
    assert relative_spread(NOISY) == pytest.approx(relative_spread(NOISY.to_dict()))
    assert relative_spread(NOISY) > 1.0


def test_a_quiet_run_gets_its_verdict():
    reason = busy_reason({"batch 1": QUIET, "batch 8": QUIET.to_dict()}, load=1.0)
    assert reason is None
    assert judge("holds", reason) == "holds"


def test_a_noisy_figure_names_itself_and_withholds_the_verdict():
    reason = busy_reason({"batch 1": QUIET, "batch 4": NOISY}, load=None)
    assert "batch 4" in reason and "%" in reason
    assert judge("holds", reason).startswith(BUSY_VERDICT)
    assert "holds" not in judge("holds", reason)


def test_a_high_load_average_withholds_the_verdict_even_with_steady_repeats():
    reason = busy_reason([QUIET], load=3.2)
    assert "load average was 3.2" in reason
    assert judge("not reached", reason).startswith(BUSY_VERDICT)


def test_the_load_probe_reads_the_os():
    load = load_per_core()
    assert load is None or load >= 0


def test_bad_input_is_refused_in_one_sentence():
    with pytest.raises(LabError, match="Timing"):
        relative_spread(1.5)


def test_the_tour_withholds_the_verdicts_of_a_section_measured_on_a_busy_machine():
    from labsupport.bench.core import reported
    from labsupport.bench.suite import mark_busy
    from labsupport.report import table_rows

    section = {"figures": [reported("speedup", 3.0, "x", target=2.0),
                           reported("spread-judged", 1.0, "x", target=2.0, busy="the repeats of x disagree")]}
    assert section["figures"][0]["met"] is True and section["figures"][1]["met"] is None
    mark_busy(section, None)
    assert section["figures"][0]["met"] is True
    mark_busy(section, busy_reason(load=4.0))
    assert section["figures"][0]["met"] is None
    assert section["figures"][1]["busy"] == "the repeats of x disagree"
    rows = table_rows({"sections": {"s": section}})
    assert all(BUSY_VERDICT in row[2] for row in rows)
