"""Notebook 02's claims table (labsupport/claims/batching.py): verdicts from synthetic measurements
that should hold, that should not, and that a busy machine produced. No timing here."""

import math

import pytest

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import batching_claims
from labsupport.claims.batching import (batch_sweep_busy_reason, headline_verdict, loop_verdict,
                                        padding_verdict, regime_verdict)
from labsupport.lab.measure import Timing


def sweep(ms_per_token, batches=(1, 2, 4, 8, 16, 32, 64)):
    """Sweep rows with the given decode step times; throughput follows from them."""
    return [{"batch": b, "ms_per_token": ms, "tokens_per_s": 1e3 * b / ms} for b, ms in zip(batches, ms_per_token)]


FLAT_THEN_LINEAR = [50, 52, 55, 60, 90, 220, 440]      # stops (below half of ideal) at batch 32
QUIET = {name: {"a": Timing([1.0, 1.02]), "b": Timing([1.0, 1.01])} for name in ("loop", "headline", "padding")}


def claims(**changes):
    values = dict(real_over_loop=3.1, ratio_16=9.0, sweep=sweep(FLAT_THEN_LINEAR), ridge=20.0, waste=0.5,
                  sorted_waste=0.1, padded_over_sorted=1.4, timings=QUIET, device_type="cpu", load=1.0)
    values.update(changes)
    rows = batching_claims(**values)
    assert [list(r) for r in rows] == [["claim", "measured", "verdict"]] * 4
    return dict(zip(("loop", "headline", "regime", "padding"), rows))


# --- (a) the chapter's 1.0x -----------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.5, 0.97, 1.2, 3.1])
def test_the_chapters_one_x_is_explained_not_measured_and_a_real_batch_is_reported(ratio):
    row = claims(real_over_loop=ratio)["loop"]
    assert row["verdict"].startswith("explained: the chapter's code has no batch")
    assert f"{ratio:.2f}x" in row["verdict"] and f"{ratio:.2f}x" in row["measured"]
    assert loop_verdict(ratio) == row["verdict"]


@pytest.mark.parametrize("ratio, says", [(3.1, "ran 3.10x"), (1.0, "gained nothing"), (0.6, "was slower")])
def test_the_real_batch_against_the_loop_says_whether_it_gained(ratio, says):
    assert says in loop_verdict(ratio)


def test_the_loop_row_is_not_measured_without_a_real_batch():
    assert claims(real_over_loop=None)["loop"]["verdict"] == "not measured here"


# --- batch 16 over batch 1 ------------------------------------------------------------------

def test_the_headline_verdicts():
    assert headline_verdict(12.0) == "holds"
    assert headline_verdict(8.5).startswith("course target")
    assert headline_verdict(3.0) == "less here"
    assert claims(ratio_16=3.0)["headline"]["verdict"] == "less here"


# --- (b) memory-bound, then compute-bound, against the ridge ---------------------------------

def test_scaling_that_stops_near_or_past_the_ridge_holds():
    row = claims()["regime"]
    assert row["verdict"].startswith("holds: scaling stops at batch 32") and "batch 20" in row["verdict"]
    assert "at batch 32" in row["measured"] and "ridge at batch 20" in row["measured"]
    assert regime_verdict(12, 20.0, 64).startswith("holds")               # from half the ridge on


def test_a_stop_at_batch_two_on_a_cpu_is_the_kernel_switch_not_the_roofline():
    early = sweep([50, 120, 130, 140, 200, 400, 800])
    verdict = claims(sweep=early)["regime"]["verdict"]
    assert verdict.startswith("not the roofline") and "matrix-vector to matrix-matrix" in verdict
    assert regime_verdict(2, 3.0, 64).startswith("holds")                 # a ridge at 3 is near batch 2
    assert regime_verdict(2, 200.0, 512, device_type="cuda").startswith("partly")


def test_a_stop_well_before_the_ridge_holds_only_partly():
    assert regime_verdict(4, 20.0, 64).startswith("partly: scaling stops at batch 4, before")


def test_scaling_over_the_whole_sweep_is_judged_by_where_the_ridge_lies():
    linear = sweep([50, 51, 52, 53, 54, 56, 60])
    assert claims(sweep=linear, ridge=300.0)["regime"]["verdict"].startswith("holds as far as measured")
    assert claims(sweep=linear, ridge=20.0)["regime"]["verdict"].startswith("not here")
    assert "no batch" in regime_verdict(None, math.inf, 64)


# --- padding --------------------------------------------------------------------------------

def test_padding_verdicts():
    assert padding_verdict(0.5, 0.1, 1.4) == "holds"
    assert padding_verdict(0.5, 0.1, 1.0).startswith("partly")
    assert padding_verdict(0.0, 0.0, 1.0).startswith("nothing to gain")


# --- (c) a busy machine ---------------------------------------------------------------------

def test_a_high_load_withholds_every_timing_verdict():
    rows = claims(load=3.0)
    assert all(row["verdict"].startswith(BUSY_VERDICT) for row in rows.values())


def test_a_noisy_timing_withholds_only_its_own_claim():
    noisy = {**QUIET, "headline": {"batch 1": Timing([1.0, 2.0]), "batch 16": Timing([1.0, 1.0])}}
    rows = claims(timings=noisy)
    assert rows["headline"]["verdict"].startswith(BUSY_VERDICT) and "batch 1" in rows["headline"]["verdict"]
    assert rows["loop"]["verdict"].startswith("explained") and rows["padding"]["verdict"] == "holds"


def test_a_larger_batch_far_faster_than_a_smaller_one_is_a_busy_machine():
    disturbed = sweep([50, 52, 130, 60, 90, 220, 440])              # batch 4 slowed down by something else
    reason = batch_sweep_busy_reason(disturbed)
    assert reason == "a step at batch 8 took 54% less time than at batch 4, though it does more work"
    rows = claims(sweep=disturbed)
    assert rows["regime"]["verdict"].startswith(BUSY_VERDICT) and "batch 8" in rows["regime"]["verdict"]
    assert rows["loop"]["verdict"].startswith("explained")
    assert batch_sweep_busy_reason(sweep(FLAT_THEN_LINEAR), load=1.0) is None


def test_the_bench_sweep_rows_are_read_too():
    rows = [{"batch": b, "ms_per_step": ms} for b, ms in ((1, 50.0), (2, 20.0))]
    assert "batch 2" in batch_sweep_busy_reason(rows)


def test_the_bench_sections_claims_come_from_its_dict():
    """`batching_section_claims` takes what the bench's batching section returns: the two rows
    the bench does not time say so, the headline and the regime are judged as the notebook's."""
    from labsupport.claims import batching_section_claims
    section = {"sweep": [dict(r, ms_per_step=r.pop("ms_per_token")) for r in sweep(FLAT_THEN_LINEAR)],
               "batch16_over_batch1": 11.0, "timings_s": {k: t.to_dict() for k, t in QUIET["headline"].items()},
               "padding": {"lengths": [3, 9], "waste": 0.5, "sorted_waste": 0.1}, "ridge_batch": 20.0,
               "device_type": "cpu", "load_per_core": 0.5}
    rows = dict(zip(("loop", "headline", "regime", "padding"), batching_section_claims(section)))
    assert rows["loop"]["verdict"] == "not measured here" and "notebook 02" in rows["loop"]["measured"]
    assert rows["padding"]["verdict"] == "not measured here" and "50% of prompt slots" in rows["padding"]["measured"]
    expected = claims(ratio_16=11.0, load=0.5)
    assert rows["headline"]["verdict"] == expected["headline"]["verdict"] == headline_verdict(11.0)
    assert rows["regime"] == expected["regime"]
    busy = batching_section_claims({**section, "load_per_core": 9.0})
    assert busy[1]["verdict"].startswith(BUSY_VERDICT)
