"""Notebook 01's claims table (labsupport/claims/kv_cache.py): verdicts from synthetic measurements
that should hold, that should not, and that a busy machine produced. No timing here."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import kv_cache_claims, step_busy_reason
from labsupport.lab.busy import more_work_faster_reason

MIB, GIB = 2 ** 20, 2 ** 30
MEMORY = [(256, 100, 100), (512, 200, 200)]
GQA = {"num_heads": 9, "kv_heads": 3, "gqa_bytes": 1000, "mha_bytes": 3000}
SEVEN_B = {"weights": 13 * GIB, "at_512": 256 * MIB, "at_128k": 64 * GIB}


def claims(speedups=None, full=(64,), same=True, memory=MEMORY, gqa=GQA, seven_b=SEVEN_B, busy=None):
    speedups = speedups if speedups is not None else {64: 2.0, 256: 6.0, 1024: 20.0}
    rows = kv_cache_claims(speedups, full, same, memory, gqa, seven_b, busy=busy)
    assert [list(r) for r in rows] == [["claim", "measured", "verdict"]] * 4
    return {name: row for name, row in zip(("speed", "long", "formula", "gqa"), rows)}


def step_rows(naive, cached, spread=0.0):
    """Rows as time_per_token_by_position returns them, at 16, 48, 80 ... tokens."""
    return [{"position": 32 * i, "sequence_length": 16 + 32 * i, "naive_s": n, "cached_s": c,
             "timings": {"naive_s": {"median": n, "spread": spread * n},
                         "cached_s": {"median": c, "spread": spread * c}}}
            for i, (n, c) in enumerate(zip(naive, cached))]


# --- the speedup claim ---------------------------------------------------------------------

def test_a_speedup_that_grows_with_the_length_holds_and_says_what_was_measured():
    row = claims()["speed"]
    assert row["verdict"].startswith("holds")
    assert "2.0x at 64 new tokens (measured)" in row["measured"]
    assert "20.0x at 1024 new tokens (estimated)" in row["measured"] and "same tokens" in row["measured"]


def test_a_speedup_that_does_not_grow_or_does_not_exist_does_not_hold():
    assert claims({64: 1.6, 256: 1.6, 1024: 1.5})["speed"]["verdict"].startswith("partly")
    assert claims({64: 0.9, 256: 1.0, 1024: 1.01})["speed"]["verdict"].startswith("not here")


def test_different_tokens_are_a_no_even_on_a_busy_machine():
    row = claims(same=False, busy="the load average was 3.0 per core")["speed"]
    assert row["verdict"].startswith("no:") and "TOKENS DIFFER" in row["measured"]


def test_a_busy_machine_withholds_the_speed_verdict_only():
    rows = claims(busy="the load average was 3.0 per core")
    assert rows["speed"]["verdict"].startswith(BUSY_VERDICT) and "3.0 per core" in rows["speed"]["verdict"]
    assert all(rows[name]["verdict"] == "holds" for name in ("formula", "gqa"))
    assert rows["long"]["verdict"].startswith("holds (computed")


# --- memory: formula, GQA, 512 -> 128K (arithmetic) ---------------------------------------

def test_the_formula_claim_holds_only_where_every_length_matches():
    assert "every length tried (256 to 512 tokens)" in claims()["formula"]["measured"]
    row = claims(memory=[(256, 100, 100), (512, 200, 256)])["formula"]
    assert row["verdict"].startswith("no") and "[512]" in row["measured"]


def test_gqa_holds_only_for_exactly_heads_over_kv_heads():
    assert claims()["gqa"]["verdict"] == "holds" and "3.00x" in claims()["gqa"]["measured"]
    assert claims(gqa={**GQA, "mha_bytes": 2000})["gqa"]["verdict"].startswith("no: 2.00x instead of 3.00x")


def test_the_long_context_row_is_labelled_computed():
    row = claims()["long"]
    assert row["measured"].startswith("computed, not measured") and "computed" in row["verdict"]
    assert row["verdict"].startswith("holds")
    small_gain = {"weights": 13 * GIB, "at_512": 1 * GIB, "at_128k": 8 * GIB}     # never outgrows the weights
    assert claims(seven_b=small_gain)["long"]["verdict"].startswith("partly")


# --- when the machine was busy ------------------------------------------------------------

def test_quiet_step_timings_give_no_reason():
    rows = step_rows(naive=[0.02, 0.03, 0.04, 0.06], cached=[0.02, 0.021, 0.02, 0.022], spread=0.05)
    assert step_busy_reason(rows, load=1.0) is None
    full = {64: {"naive_s": {"median": 2.0, "spread": 0.1}, "cached_s": {"median": 1.0, "spread": 0.05}}}
    assert step_busy_reason(rows, full, load=None) is None


def test_a_longer_sequence_far_faster_than_a_shorter_one_is_a_busy_machine():
    rows = step_rows(naive=[0.02, 0.09, 0.04, 0.06], cached=[0.02, 0.02, 0.02, 0.02])
    reason = step_busy_reason(rows)
    assert "80 tokens without the cache took 56% less time than at 48 tokens" in reason
    rows = step_rows(naive=[0.02, 0.03, 0.04, 0.06], cached=[0.05, 0.02, 0.02, 0.02])
    assert "with" not in step_busy_reason(rows) and "48 tokens took 60% less" in step_busy_reason(rows)


def test_spread_and_load_are_busy_signs_too():
    rows = step_rows(naive=[0.02, 0.03], cached=[0.02, 0.02], spread=0.5)
    assert "disagree" in step_busy_reason(rows)
    quiet = step_rows(naive=[0.02, 0.03], cached=[0.02, 0.02])
    assert "load average" in step_busy_reason(quiet, load=2.5)
    noisy_full = {256: {"naive_s": {"median": 10.0, "spread": 6.0}}}
    assert "naive full run of 256 tokens" in step_busy_reason(quiet, noisy_full)


def test_more_work_faster_reason_allows_small_dips_and_names_the_sizes():
    name = lambda n: f"batch {n}"
    assert more_work_faster_reason([(1, 10.0), (2, 9.0), (4, 12.0)], name) is None     # a 10% dip is noise
    assert more_work_faster_reason([(1, 10.0), (8, 4.0)], name) == \
        "a step at batch 8 took 60% less time than at batch 1, though it does more work"
    assert more_work_faster_reason([], name) is None


@pytest.mark.parametrize("load", [None, 0.9])
def test_rows_without_timings_still_work(load):
    rows = [{"sequence_length": 16, "naive_s": 0.02}, {"sequence_length": 48, "naive_s": 0.03}]
    assert step_busy_reason(rows, load=load) is None
