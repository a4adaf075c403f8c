"""On a GPU every timed decode step is a replayed CUDA graph (issue 35): `step_timing.step_runner`
captures the step once (`measure.captured`) and the timings replay it; only notebook 00's profile,
whose lesson is the launches, runs it eagerly. No GPU here: torch.cuda's stream and graph calls
are replaced by stand-ins that record what was asked, and the step itself runs on the CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

from labsupport.errors import LabError
from labsupport.lab import kv_cache_timing, long_context, roofline, roofline_step_profile, step_timing
from labsupport.lab.measure import GRAPHED_STEP as GRAPHED, captured
from labsupport.lab.step_timing import filled_cache, step_runner

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: counts replays."""
    captured = 0

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream and graph calls, answered on the CPU; counts the captures."""
    log = {"captures": 0}

    @contextlib.contextmanager
    def capture(graph, pool=None):
        log["captures"] += 1
        yield

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    return log


def test_a_graphed_runner_captures_once_and_replays(tiny_llama, fake_cuda):
    cache = filled_cache(tiny_llama, 2, 8)
    calls = []

    def step(model, cache, tokens):
        calls.append(cache.length)
        return model.logits(model(tokens[:, None], None, cache), at=-1)
    run = step_runner(tiny_llama, cache, step, graphed=True)
    assert run.path == GRAPHED and fake_cuda["captures"] == 1
    assert calls == [8, 8, 8, 8]                        # three warm-ups and the capture, each rolled back
    out = run()
    assert run.graph.replays == 1 and calls == [8] * 4   # a replay runs no Python step
    assert out.shape == (2, tiny_llama.config.vocab_size) and cache.length == 8


def test_on_a_cpu_the_runner_stays_eager(tiny_llama):
    run = step_runner(tiny_llama, filled_cache(tiny_llama, 1, 4))
    assert run.path == "eager"
    assert run().shape == (1, tiny_llama.config.vocab_size)


def test_a_step_that_cannot_be_captured_is_a_failed_measurement_in_one_sentence(fake_cuda):
    def host_sync():
        raise RuntimeError("operation not permitted when stream is capturing\nmore lines")
    with pytest.raises(LabError, match=r"the step could not be captured as a CUDA graph \(.*capturing\).*launches") as error:
        captured(host_sync, "cpu", "the step", graphed=True)
    assert "\n" not in str(error.value)


def test_notebook_01s_uncached_step_is_graphed_on_a_gpu_too(tiny_llama, monkeypatch):
    """Cached against uncached: on a GPU both sides replay a graph, or the uncached side would
    be timed launch by launch."""
    captured = []
    monkeypatch.setattr(kv_cache_timing, "captured", lambda fn, device, what: fn if device.type != "cuda" else captured.append(what) or fn)
    sequence = torch.zeros(1, 6, dtype=torch.long)
    kv_cache_timing._naive_step(tiny_llama, sequence)
    assert captured == []                                         # a CPU: eager
    monkeypatch.setattr(type(tiny_llama), "device", property(lambda self: torch.device("cuda")))
    kv_cache_timing._naive_step(tiny_llama, sequence)
    assert captured == ["the uncached step over 6 tokens"]


@pytest.mark.parametrize("timing", ["roofline", "kv_cache_timing", "long_context"])
def test_every_timed_step_asks_for_the_default_path_and_the_profile_for_eager(tiny_llama, monkeypatch, timing):
    """The step timings of notebooks 00, 01 and 08 leave `graphed` at its default (a CUDA graph on a
    GPU); notebook 00's profile asks for eager. A spy records what each asked for."""
    asked = []

    def spy(model, cache, step=None, seed=0, graphed=None):
        asked.append(graphed)
        return step_timing.step_runner(model, cache, step, seed, graphed=False)
    modules = {"roofline": roofline, "kv_cache_timing": kv_cache_timing, "long_context": long_context}
    monkeypatch.setattr(modules[timing], "step_runner", spy)
    if timing == "roofline":
        roofline.time_decode_step(tiny_llama, 1, context=4, repeats=1)
    elif timing == "kv_cache_timing":
        kv_cache_timing._cached_step(tiny_llama, torch.zeros(1, 6, dtype=torch.long))
    else:
        long_context.time_cache_kinds(tiny_llama, context=4, repeats=1)
    assert asked and all(g is None for g in asked)

    monkeypatch.setattr(roofline_step_profile, "step_runner", spy)
    asked.clear()
    roofline_step_profile.profile_decode_step(tiny_llama, steps=1, context=4)
    assert asked == [False]


def test_eager_against_graphed_times_the_same_step_both_ways(tiny_llama, fake_cuda):
    from labsupport.lab.step_timing import eager_against_graphed
    timings = eager_against_graphed(tiny_llama, batch=2, context=5, repeats=3)
    assert list(timings) == ["eager", GRAPHED] and fake_cuda["captures"] == 1
    assert all(len(t.samples) == 3 for t in timings.values())
