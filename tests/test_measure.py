"""Tests for labsupport.lab.measure: the timing path and the memory tracker."""

import statistics
import time

import pytest
import torch

from labsupport.lab import measure
from labsupport.errors import LabError
from labsupport.lab.measure import Timing, time_fn, time_side_by_side, track_peak_memory

# ---------------------------------------------------------------- Timing math


def test_timing_summary_with_many_samples():
    timing = Timing([5.0, 1.0, 3.0, 2.0, 4.0])
    assert timing.median == 3.0
    assert timing.min == 1.0
    assert timing.max == 5.0
    assert timing.spread == pytest.approx(2.0)  # 75th (4.0) minus 25th (2.0) percentile


def test_timing_spread_matches_linear_percentiles():
    samples = [0.10, 0.12, 0.11, 0.30, 0.13, 0.12]
    q1, q3 = statistics.quantiles(samples, n=4, method="inclusive")[0::2]
    assert Timing(samples).spread == pytest.approx(q3 - q1)
    assert Timing(samples).spread < Timing(samples).max - Timing(samples).min  # the outlier is ignored


def test_timing_spread_with_few_samples_is_range():
    assert Timing([2.0, 7.0, 3.0]).spread == 5.0
    assert Timing([4.0]).spread == 0.0
    assert Timing([2.0, 4.0]).median == 3.0


def test_timing_to_dict_and_str():
    timing = Timing([0.001, 0.002, 0.003])
    data = timing.to_dict()
    assert data["samples"] == [0.001, 0.002, 0.003]
    assert data["median"] == 0.002 and data["min"] == 0.001 and data["max"] == 0.003
    assert data["spread"] == pytest.approx(0.002)
    assert str(timing).startswith("2 ms median")


# ---------------------------------------------------------------- time_fn


@pytest.fixture
def events(monkeypatch):
    """Record every device synchronization in a list, alongside whatever the test records."""
    log = []
    monkeypatch.setattr(measure, "synchronize", lambda device: log.append("sync"))
    return log


def test_time_fn_calls_warmup_plus_repeats(events):
    calls = []
    timing = time_fn(lambda: calls.append(1), "cpu", warmup=2, repeats=4)
    assert len(calls) == 6
    assert len(timing.samples) == 4
    assert all(sample >= 0 for sample in timing.samples)


def test_time_fn_synchronizes_around_every_timed_call(events):
    time_fn(lambda: events.append("call"), "cpu", warmup=1, repeats=3)
    timed = events[events.index("call") + 1 :]  # after the warm-up call
    assert timed[0] == "sync"  # the warm-up work is finished before the clock starts
    assert timed.count("call") == 3
    for i, event in enumerate(timed):
        if event == "call":
            assert timed[i - 1] == "sync" and timed[i + 1] == "sync"


def test_time_fn_measures_real_time():
    timing = time_fn(lambda: time.sleep(0.01), "cpu", warmup=0, repeats=3)
    assert 0.009 < timing.median < 0.5


def test_time_fn_rejects_zero_repeats():
    with pytest.raises(LabError, match="repeats >= 1"):
        time_fn(lambda: None, "cpu", repeats=0)


# ---------------------------------------------------------------- time_side_by_side


def test_side_by_side_interleaves_and_rotates(events):
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timings = time_side_by_side(fns, "cpu", warmup=1, repeats=4)

    assert order[:3] == ["a", "b", "c"]  # warm-up, once each
    rounds = [order[i : i + 3] for i in range(3, len(order), 3)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert list(timings) == ["a", "b", "c"]
    assert all(len(t.samples) == 4 for t in timings.values())


def test_side_by_side_attributes_time_to_the_right_candidate():
    timings = time_side_by_side(
        {"slow": lambda: time.sleep(0.02), "fast": lambda: None}, "cpu", warmup=0, repeats=3
    )
    assert timings["slow"].min > 0.015
    assert timings["fast"].max < 0.015


def test_side_by_side_needs_candidates():
    with pytest.raises(LabError):
        time_side_by_side({}, "cpu")


# ---------------------------------------------------------------- track_peak_memory


def _current_rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(measure.resource is None, reason="needs resource.getrusage (not on Windows)")
def test_track_peak_memory_on_cpu_sees_a_large_allocation():
    try:
        headroom = max(0, measure._peak_rss_bytes() - _current_rss_bytes())
    except OSError:
        pytest.skip("needs /proc/self/statm to size the allocation")
    size = headroom + 96 * 2**20  # enough to push the process's all-time peak up
    with track_peak_memory("cpu") as mem:
        block = torch.ones(size, dtype=torch.uint8)  # ones, not empty: pages must be touched
        del block
    assert mem.device == "cpu" and mem.exact is False
    assert mem.peak_bytes >= 64 * 2**20


def test_track_peak_memory_on_cpu_reports_zero_below_earlier_peak():
    with track_peak_memory("cpu") as mem:
        pass
    assert mem.peak_bytes >= 0
    assert mem.peak_bytes < 16 * 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_track_peak_memory_on_cuda_is_exact():
    keep = torch.ones(2**20, device="cuda")  # already allocated: must not count
    with track_peak_memory("cuda") as mem:
        block = torch.ones(64 * 2**20, dtype=torch.uint8, device="cuda")
        del block
    assert mem.exact is True
    assert 64 * 2**20 <= mem.peak_bytes < 80 * 2**20
    del keep


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_fn_on_cuda_waits_for_the_gpu():
    a = torch.randn(4096, 4096, device="cuda")
    timing = time_fn(lambda: a @ a, "cuda", warmup=1, repeats=3)
    assert timing.median > 1e-5  # without synchronization this would be launch time only


def test_on_cuda_each_call_is_timed_by_cuda_events_not_the_host_clock(monkeypatch):
    """The GPU's own clock (two CUDA events around the call), so a 0.5 ms copy is not mostly the
    synchronize's latency: simulated here by events whose elapsed time is set."""
    from labsupport.lab import measure

    recorded = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = len(recorded)
            recorded.append(self)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 2.5 * (end.at - self.at)            # ms

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(measure, "synchronize", lambda device: None)
    calls = []
    seconds = measure._time_once(lambda: calls.append(1), torch.device("cuda"))
    assert calls == [1] and len(recorded) == 2 and seconds == pytest.approx(2.5e-3)


def test_a_warmup_fn_runs_instead_of_the_timed_one_on_a_cpu():
    calls = []
    timings = time_side_by_side({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, "cpu",
                                warmup=2, repeats=1, warmup_fns={"a": lambda: calls.append("short a")})
    assert calls[:4] == ["short a", "short a", "b", "b"] and sorted(calls[4:]) == ["a", "b"]
    assert set(timings) == {"a", "b"}
    with pytest.raises(LabError, match="warmup_fns names"):
        time_side_by_side({"a": lambda: None}, "cpu", warmup_fns={"c": lambda: None})
    calls.clear()
    time_fn(lambda: calls.append("long"), "cpu", warmup=1, repeats=1, warmup_fn=lambda: calls.append("short"))
    assert calls == ["short", "long"]


def test_a_gpu_warms_up_with_the_timed_function_itself(monkeypatch):
    from labsupport.lab import measure
    fn, short = object(), object()
    assert measure._warmup_fn(fn, short, torch.device("cuda")) is fn         # it compiles the timed shapes
    assert measure._warmup_fn(fn, short, torch.device("cpu")) is short
    assert measure._warmup_fn(fn, None, torch.device("cpu")) is fn
