"""claims.roofline: notebook 00's verdicts on the chapter's claims, from synthetic sweeps that
should hold, that should not, and that were measured on a busy machine."""

import pytest
import torch

from labsupport.lab import roofline
from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims.roofline import claims_summary, falling_time_reason, roofline_claims, sweep_busy_reason
from labsupport.errors import LabError
from labsupport.lab.measure import Timing
from labsupport.lab.roofs import HardwareProfile
from labsupport.engine.config import PRESETS

TINY = PRESETS["tiny-llama"]
# ridge 10 FLOP/B: tiny-llama's float32 decode step (context 0, ~batch / 2 FLOP/B) reaches it near batch 20.
# A slow machine, so that the times below sit near its roofline: tiny-llama's 363 kB of weights take 9 ms.
PROFILE = HardwareProfile(device="cpu", name="fake CPU", bandwidth=40e6, flops={"float32": 400e6})
QUIET_LOAD = 1.0


def sweep(seconds: dict, noisy_batch: int | None = None, dtype="float32") -> list[dict]:
    """Decode-sweep rows as `sweep_decode` returns them, with steady repeats except at `noisy_batch`."""
    rows = []
    for batch, s in seconds.items():
        samples = [s, 2.5 * s, s] if batch == noisy_batch else [s, 1.02 * s, 0.99 * s]
        cost = roofline.decode_step_cost(TINY, batch, 0, torch.float32)
        rows.append(roofline._row(batch, Timing(samples), cost, dtype))
    return rows


def verdicts(rows, profile=PROFILE, load=QUIET_LOAD):
    return [c["verdict"] for c in roofline_claims(rows, profile, load=load)]


TEXTBOOK = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.012, 16: 0.014, 32: 0.025, 64: 0.050}


def test_a_textbook_sweep_holds():
    # flat below the ridge, time proportional to the batch past it (batches 32 and 64)
    assert verdicts(sweep(TEXTBOOK)) == ["holds", "holds", "holds"]


def test_extra_rows_that_are_not_free_only_partly_hold():
    rows = sweep({**TEXTBOOK, 2: 0.016, 4: 0.018})
    assert verdicts(rows)[0].startswith("partly: below the ridge")


def test_a_time_that_stays_flat_past_the_ridge_is_not_compute_bound():
    rows = sweep({1: 0.010, 2: 0.010, 4: 0.010, 8: 0.011, 16: 0.011, 32: 0.012, 64: 0.013})
    assert verdicts(rows)[1].startswith("partly: past the ridge")


def test_the_kernel_switch_at_batch_2_is_not_the_ridge():
    # the time jumps at batch 2 (matrix-vector -> matrix-matrix kernel) and grows a little after,
    # but the sweep never passes the ridge: compute-bound is not reached, whatever the time does
    rows = sweep({1: 0.010, 2: 0.017, 4: 0.019, 8: 0.024, 16: 0.040})
    claims = roofline_claims(rows, PROFILE, load=QUIET_LOAD)
    assert claims[1]["verdict"] == "not reached in this sweep"
    assert "below the ridge (10.0 FLOP/B)" in claims[1]["measured"]
    assert claims[0]["verdict"].startswith("partly")          # 4 rows take 1.9x the time of one


def test_compute_bound_is_judged_past_the_ridge_only():
    # the same growth, with a ridge so low that every batch is past it, then so high that none is
    rows = sweep(TEXTBOOK)
    low = HardwareProfile(device="cpu", name="low ridge", bandwidth=100e9, flops={"float32": 10e9})
    high = HardwareProfile(device="cpu", name="high ridge", bandwidth=1e9, flops={"float32": 1e12})
    assert verdicts(rows, low)[0] == "does not hold: batch 1 is already past the ridge here"
    assert verdicts(rows, high)[1] == "not reached in this sweep"


def test_steps_far_below_the_roofline_only_partly_hold():
    # the textbook shape, five times slower: batch 1 at 18% of the memory roof, batch 64 at 12% of the
    # roofline; the shape alone does not make a step memory- or compute-bound
    slow = sweep({batch: 5 * s for batch, s in TEXTBOOK.items()})
    small, large, _ = verdicts(slow)
    assert small == ("partly: below the ridge and extra rows are nearly free, but batch 1 runs at 18% of the "
                     "memory roof: overheads set its pace")
    assert large.startswith("partly: past the ridge and the time grows with the batch, but at 12% of the roofline")
    assert roofline.step_bounds(slow, PROFILE)[0] == roofline.step_bounds(slow, PROFILE)[-1] == "overhead-bound"


def test_the_throughput_claim():
    assert verdicts(sweep(TEXTBOOK))[2] == "holds"                               # 16 x 0.010 / 0.014 = 11x
    assert verdicts(sweep({**TEXTBOOK, 16: 0.040}))[2] == "less here"            # 4x


@pytest.mark.parametrize("why, rows, load, said", [
    ("noisy repeats", sweep(TEXTBOOK, noisy_batch=8), QUIET_LOAD, "float32 batch 8"),
    ("high load", sweep(TEXTBOOK), 3.0, "load average was 3.0"),
    ("time falls with the batch", sweep({1: 0.9, 2: 2.5, 4: 2.5, 8: 0.35, 16: 0.40, 32: 0.6}), QUIET_LOAD,
     "a step at float32 batch 8 took 61% less time than at float32 batch 1"),
])
def test_a_busy_machine_gets_no_verdict(why, rows, load, said):
    claims = roofline_claims(rows, PROFILE, load=load)
    for claim in claims:
        assert claim["verdict"].startswith(BUSY_VERDICT), why
        assert said in claim["verdict"]
        assert "holds" not in claim["verdict"] and "not reached" not in claim["verdict"]
    assert claims_summary(claims).startswith("The machine was busy")


def test_falling_time_is_judged_per_dtype_and_with_a_margin():
    # a little faster at a larger batch is noise a quiet machine shows; half the time is not
    assert falling_time_reason(sweep({1: 0.010, 2: 0.012, 4: 0.011, 8: 0.013})) is None
    assert "batch 4" in falling_time_reason(sweep({1: 0.010, 2: 0.030, 4: 0.012}))
    # float32 at batch 8 and bfloat16 at batch 1: different dtypes are never compared
    mixed = sweep({1: 0.010, 8: 0.012}) + sweep({1: 0.030, 8: 0.031}, dtype="bfloat16")
    assert sweep_busy_reason(mixed, load=QUIET_LOAD) is None


def test_the_summary_is_built_from_the_verdicts():
    held = roofline_claims(sweep(TEXTBOOK), PROFILE, load=QUIET_LOAD)
    assert claims_summary(held).startswith("In this run every one of the chapter's claims holds")
    mixed = roofline_claims(sweep({**TEXTBOOK, 16: 0.040}), PROFILE, load=QUIET_LOAD)
    summary = claims_summary(mixed)
    assert summary.startswith("In this run the chapter's claims hold only in part")
    assert "less here (float32)" in summary and "a large batch is compute-bound" in summary
    flat = sweep({1: 0.010, 2: 0.016, 4: 0.018, 8: 0.018, 16: 0.040})
    assert claims_summary(roofline_claims(flat, PROFILE, load=QUIET_LOAD)).startswith("In this run none")


def test_the_summary_says_each_busy_reason_once():
    noisy = roofline_claims(sweep(TEXTBOOK, noisy_batch=8), PROFILE, load=3.0)
    with_bf16 = HardwareProfile(device="cpu", name="fake CPU", bandwidth=40e6,
                                flops={"float32": 400e6, "bfloat16": 800e6})
    also_noisy = roofline_claims(sweep(TEXTBOOK, noisy_batch=4, dtype="bfloat16"), with_bf16, load=3.0)
    summary = claims_summary(noisy + also_noisy)
    assert summary.count("load average was 3.0") == 1
    assert "float32 batch 8" in summary and "bfloat16 batch 4" in summary
    assert summary.count("no verdict (busy machine)") == 6 and "holds" not in summary


def test_rows_without_a_timing_are_judged_on_the_rest():
    rows = sweep(TEXTBOOK)
    for row in rows:
        del row["timing"]
    assert verdicts(rows, load=None) == ["holds", "holds", "holds"]


def test_an_empty_sweep_is_refused():
    with pytest.raises(LabError, match="sweep_decode"):
        roofline_claims([], PROFILE)
