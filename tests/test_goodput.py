"""TTFT, TPOT and goodput have one home (issue 47, item 6): `lab.serving_metrics`. The load generator
(09), disaggregated serving (10) and the goodput exercise's checker (10) all judge by it, so they
cannot drift apart; bad rows get one sentence (issue 50)."""

import math

import pytest

from labsupport.checks.tensor_parallel_goodput import reference_goodput
from labsupport.errors import LabError
from labsupport.lab import tensor_parallel_disaggregated
from labsupport.lab.http_serving_loadgen import LoadResult
from labsupport.lab.http_serving_loadgen import goodput as loadgen_goodput
from labsupport.lab.serving_metrics import goodput, request_times, time_per_output_token

RESULTS = [LoadResult(arrival=0.0, sent=1.0, chunk_times=[1.2, 1.3, 1.4], tokens=3),      # meets both
           LoadResult(arrival=0.5, sent=1.5, chunk_times=[2.9, 3.0], tokens=2),           # TTFT 1.4 s: misses
           LoadResult(arrival=1.0, sent=2.0, chunk_times=[2.1], tokens=1),                # one token: TPOT 0
           LoadResult(arrival=1.5, sent=float("nan"), error="connection refused")]        # never sent


def test_tpot_is_the_mean_gap_between_later_tokens_and_none_below_two():
    assert time_per_output_token(1.0, 1.6, 4) == pytest.approx(0.2)
    assert time_per_output_token(1.0, 1.0, 1) is None
    assert request_times(0.5, 1.0, 1.0, 1) == {"ttft": 0.5, "tpot": 0.0, "finished": 1.0}


def test_the_load_generator_the_disaggregated_rows_and_the_checker_use_the_one_goodput():
    rows = [request_times(r.sent, r.chunk_times[0], r.chunk_times[-1], r.tokens) for r in RESULTS[:3]]
    one = goodput(rows, 0.5, 0.15, start=1.0, requests=4)
    assert one["goodput"] == pytest.approx(2 / (3.0 - 1.0)) and one["met"] == pytest.approx(2 / 4)
    assert loadgen_goodput(RESULTS, 0.5, 0.15) == one
    assert tensor_parallel_disaggregated.goodput is goodput
    trace = [{"ttft": 0.2, "tpot": 0.05, "finished": 2.0}, {"ttft": 0.9, "tpot": 0.05, "finished": 4.0}]
    assert reference_goodput(trace, 0.5, 0.1) == goodput(trace, 0.5, 0.1)["goodput"] == pytest.approx(1 / 4)


def test_a_request_never_sent_neither_counts_nor_moves_the_span_whatever_its_place():
    """Issue 50: a NaN `sent` first made min() return nan and the goodput 0."""
    forward = loadgen_goodput(RESULTS, 0.5, 0.15)
    backward = loadgen_goodput(RESULTS[::-1], 0.5, 0.15)
    assert forward == backward and forward["goodput"] > 0
    assert loadgen_goodput([RESULTS[-1]], 0.5, 0.15)["goodput"] == 0.0       # nothing served: none met


@pytest.mark.parametrize("rows, kwargs, message", [
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 0.0}], {}, "after start"),                   # a zero-length span
    ([{"ttft": float("nan"), "tpot": 0.1, "finished": 1.0}], {}, "finite 'ttft'"),
    ([{"ttft": 0.1, "finished": 1.0}], {}, "finite 'tpot'"),
    ([], {}, "at least one request"),
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 1.0}], {"requests": 0}, "at least one request"),
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 1.0}], {"ttft_slo": 0}, "ttft_slo"),
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 1.0}], {"tpot_slo": float("nan")}, "tpot_slo"),
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 1.0}], {"ttft_slo": -1.0}, "ttft_slo"),
    ([{"ttft": 0.1, "tpot": 0.1, "finished": 1.0}], {"start": math.inf}, "start"),
])
def test_bad_rows_and_objectives_are_one_sentence(rows, kwargs, message):
    args = {"ttft_slo": 1.0, "tpot_slo": 0.2} | kwargs
    with pytest.raises(LabError, match=message) as error:
        goodput(rows, **args)
    assert "\n" not in str(error.value)
