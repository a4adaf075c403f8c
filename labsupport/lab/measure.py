"""The one way this course times code and measures memory.

Introduced in notebook 00 (where the time goes). Every benchmark in the
course goes through these functions, so every number is taken the same way:

* warm-up calls first (the first call pays for allocation and compilation; on a GPU
  at least one, whatever the caller asks: there the first call compiles the decode step);
* the device is synchronized before and after each call (GPUs run
  asynchronously, so without it the clock stops before the work is done);
* several repeats, summarized by the median, with the spread shown too;
* when two versions are compared, their runs are interleaved
  (`time_side_by_side`), so a noisy moment hits both alike;
* on a GPU every timed decode is a replayed CUDA graph, for every contender alike
  (`timed_compile`, `require_graphed`); compiling and recording are reported apart.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from labsupport.errors import LabError
from labsupport.engine.compiled import CUDA_GRAPHS
from labsupport.engine.graphs import CaptureFailed, capture
from labsupport.engine.serving.decode_graphs import GRAPHED as SERVING_GRAPHED
from labsupport.engine.hardware import pick_device, synchronize
from labsupport.lab import progress

try:
    import resource  # Linux and macOS only
except ImportError:  # Windows: CPU peak memory cannot be read, see track_peak_memory
    resource = None


def _format_seconds(seconds: float) -> str:
    """0.0123 -> "12.3 ms"."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@dataclass
class Timing:
    """Wall-clock samples (in seconds) of repeated runs of one piece of code.

    Introduced in notebook 00 (where the time goes). Report the `median`:
    unlike the mean, one run disturbed by the machine does not move it.
    """

    samples: list[float]

    @property
    def median(self) -> float:
        """The middle sample: the typical run time, in seconds."""
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        """The fastest run, in seconds."""
        return min(self.samples)

    @property
    def max(self) -> float:
        """The slowest run, in seconds."""
        return max(self.samples)

    @property
    def spread(self) -> float:
        """How much the runs disagree, in seconds.

        The interquartile range (75th minus 25th percentile, computed like
        numpy.percentile) with 4 or more samples; max minus min with fewer.
        """
        if len(self.samples) < 4:
            return self.max - self.min
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q3 - q1

    def to_dict(self) -> dict:
        """A plain dict with the samples and their summary (for JSON or a table)."""
        return {"samples": list(self.samples), "median": self.median, "min": self.min, "max": self.max,
                "spread": self.spread}

    def __str__(self) -> str:
        return (
            f"{_format_seconds(self.median)} median "
            f"(spread {_format_seconds(self.spread)}, {len(self.samples)} runs)"
        )


def _warmup_calls(warmup: int, repeats: int, device: torch.device) -> int:
    """Refuse counts that would give no samples. On a GPU at least one warm-up call runs: its
    first call of a compiled decode step's shape compiles and records it (`engine.compiled`)."""
    if repeats < 1 or warmup < 0:
        raise LabError(f"Got warmup={warmup}, repeats={repeats}; use warmup >= 0 and repeats >= 1.")
    return max(warmup, 1) if device.type == "cuda" else warmup


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call of fn, with the device idle before and finished after.

    On CUDA the clock is a pair of CUDA events recorded on the current stream around the
    call (`torch.cuda.Event(enable_timing=True)`, `elapsed_time` in ms): the GPU's own clock,
    from the first kernel's turn to the last one's end, host launch gaps included. A host
    timer would add the synchronize's latency (tens of µs), which is most of a 0.5 ms copy.
    """
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


# A CPU warm-up of a generation makes this many tokens, not the timed run's hundred (`_warmup_fn`).
WARMUP_TOKENS = 8


def _warmup_fn(fn: Callable[[], object], short: Callable[[], object] | None, device: torch.device):
    """What a warm-up call runs: `short` (the same code on a smaller job: a few new tokens instead
    of a hundred) on a CPU, where a warm-up only has to touch the memory and start the threads a
    timed call will use; the timed function itself on a GPU, whose warm-up must compile and record
    the very shapes that are timed (`engine.compiled`)."""
    return short if short is not None and device.type != "cuda" else fn


def time_fn(fn: Callable[[], object], device, warmup: int = 1, repeats: int = 5,
            warmup_fn: Callable[[], object] | None = None) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `repeats` timed calls.

    Introduced in notebook 00 (where the time goes). The device is
    synchronized before and after every call, and the clock is
    `time.perf_counter`. warmup_fn: a cheaper call of the same code for the warm-up
    (`_warmup_fn` says where it is used).
    """
    device = pick_device(device)
    warm = _warmup_fn(fn, warmup_fn, device)
    for _ in range(_warmup_calls(warmup, repeats, device)):
        warm()
    synchronize(device)
    return Timing([_time_once(fn, device) for _ in range(repeats)])


def time_side_by_side(
    fns: dict[str, Callable[[], object]], device, warmup: int = 1, repeats: int = 5,
    warmup_fns: dict[str, Callable[[], object]] | None = None,
) -> dict[str, Timing]:
    """Time several candidates fairly against each other; returns a Timing per name.

    Introduced in notebook 00 (where the time goes). Instead of timing A five
    times and then B five times, each round runs every candidate once, and the
    starting candidate rotates from round to round (A B C, then B C A, then
    C A B, ...). A slow moment of the machine then lands on all candidates
    alike, which is how every speed ratio in the course is measured.
    warmup_fns: {name: a cheaper call of the same code} for the warm-up (`_warmup_fn`).
    """
    if not fns:
        raise LabError("time_side_by_side got no functions; pass a dict such as {'name': fn}.")
    unknown = set(warmup_fns or {}) - set(fns)
    if unknown:
        raise LabError(f"warmup_fns names {sorted(unknown)}, which fns does not time; give a warm-up only "
                       f"for the names of fns ({sorted(fns)}).")
    device = pick_device(device)
    warmup = _warmup_calls(warmup, repeats, device)
    names = list(fns)
    for name in names:
        progress.timing(f"{name} (warm-up)")        # named beside the tour's bar (progress.py)
        warm = _warmup_fn(fns[name], (warmup_fns or {}).get(name), device)
        for _ in range(warmup):
            warm()
    synchronize(device)

    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            progress.timing(f"{name} ({round_index + 1}/{repeats})")
            samples[name].append(_time_once(fns[name], device))
    return {name: Timing(samples[name]) for name in names}


# The decode paths a timed figure can say (`GenerationResult.decode_path` gives ours): on a GPU
# only a replayed CUDA graph passes, ours or Hugging Face's static cache + torch.compile.
NOT_GRAPHED = "eager (not graphed)"
HF_GRAPHED = "HF static cache + torch.compile (reduce-overhead: CUDA graphs)"
HF_UNGRAPHED = "HF static cache + torch.compile without CUDA graphs"    # asked for them, torch skipped or recorded none
GRAPHED_STEP, EAGER_STEP = "CUDA graph", "eager"     # the path of one timed pass (`captured`)
# The peers' own serving loops: vLLM captures CUDA graphs unless told enforce_eager (we never do);
# transformers' continuous batching pre-captures them by default (generate_batch's `warmup`, 5.14+).
VLLM_GRAPHED = "vLLM (CUDA graphs, its default)"
HF_CB_GRAPHED = "transformers continuous batching (CUDA graphs, its default)"
GRAPHED_PATHS = (CUDA_GRAPHS, HF_GRAPHED, SERVING_GRAPHED, GRAPHED_STEP, VLLM_GRAPHED, HF_CB_GRAPHED)


def ungraphed_paths(paths) -> list[str]:
    """The decode paths that say they ran without CUDA graphs on a GPU: our own eager loops
    (`NOT_GRAPHED`) and a Hugging Face run whose graphs torch skipped or never recorded
    (`HF_UNGRAPHED`). Notebook 07 (putting it together) flags a stage row with one."""
    return [p for p in paths if p == NOT_GRAPHED or p.startswith(HF_UNGRAPHED)]


def timed_compile(device) -> bool:
    """The `compile=` every timed `generate` passes: True on a CUDA GPU, False elsewhere.

    Introduced in notebook 00 (where the time goes). On a GPU an eager decode step of a small
    model is bound by launching its few hundred kernels, so timing it measures the launches,
    not the memory; a replayed CUDA graph (`engine.compiled`) measures the memory. Every
    contender is timed graphed there, alike. On a CPU there is no launch cost to hide, and
    compiling pays only for long runs (notebook 07), so timed decodes stay eager. Notebook
    00's profile stays eager on purpose: there the launches are the lesson (`roofline_step_profile`).
    """
    return pick_device(device).type == "cuda"


def require_graphed(result, what: str, device):
    """`result` (a `GenerationResult`, or its decode path as a string) if its decode steps were
    a replayed CUDA graph or the device is not a CUDA GPU; else a LabError: on a GPU a contender
    that could not be graphed is a failed measurement, never a silent eager figure.

    Introduced in notebook 00 (where the time goes). `what` names the contender."""
    if pick_device(device).type != "cuda":
        return result
    path = result if isinstance(result, str) else getattr(result, "decode_path", "eager")
    if path in GRAPHED_PATHS:
        return result
    note = None if isinstance(result, str) else getattr(result, "decode_note", None)
    because = f" ({note})" if note else ""
    raise LabError(f"{what} ran its decode steps {path}{because}, not as a replayed CUDA graph, so its "
                   f"timing on this GPU would measure kernel launches; it is a failed measurement.")


def captured(fn: Callable[[], object], device, what: str, graphed: bool | None = None) -> Callable[[], object]:
    """`fn` as a timed contender: where `graphed` (None: on a CUDA GPU) a zero-argument function
    replaying a CUDA graph of it (`engine.graphs.capture`: warmed up on a side stream, captured
    once), returning fn's output; elsewhere `fn` itself. `fn` must leave the host's state as it
    found it (a pass that truncates its cache after itself), since a replay runs only the
    recorded kernels. A pass that cannot be captured is a failed measurement: a LabError naming
    `what`, never a figure timed launch by launch. A replay's ``path`` is `GRAPHED_STEP`.

    Introduced in notebook 00 (where the time goes); notebook 05 times its verify pass so."""
    device = pick_device(device)
    if graphed is None:
        graphed = device.type == "cuda"
    if not graphed:
        return fn
    try:
        replay = capture(fn, device, what)
    except CaptureFailed as error:
        raise LabError(f"{error}; timed launch by launch it would measure kernel launches, not the GPU's "
                       f"work, so it is a failed measurement.") from None
    replay.path = GRAPHED_STEP
    return replay


def mark_graphed(figure: dict, paths, device) -> dict:
    """`figure` (a bench `reported` entry) with the decode paths it timed under ``"paths"``; on a
    CUDA GPU, where one of them is not a replayed CUDA graph, a failed measurement: ``"graphed"``
    False, no verdict (``"met"`` None) and a note saying so. Notebook 00 (where the time goes)."""
    paths = sorted({p for p in paths if p})
    figure["paths"] = paths
    if pick_device(device).type == "cuda":
        bad = [p for p in paths if p not in GRAPHED_PATHS]
        figure["graphed"] = not bad
        if bad:
            figure["met"] = None
            figure["note"] = (f"failed measurement: not graphed on this GPU ({', '.join(bad)}), so it times "
                              f"kernel launches. " + figure.get("note", ""))
    return figure


def path_note(result) -> str:
    """One sentence for a figure's note: the decode path a `GenerationResult` ran, and its
    compile/capture (warm-up) seconds, which are never in the timed seconds. Notebook 00."""
    return (f"decode path: {result.decode_path}; compile/capture {result.warmup_seconds:.2f} s, "
            f"reported apart from the timed seconds.")


@dataclass
class PeakMemory:
    """Filled in by `track_peak_memory` when its `with` block ends.

    `peak_bytes` is the highest memory use during the block above the use at
    its start. `exact` says whether the device could report a true peak
    (CUDA can; on CPU and Apple GPUs the figure is coarse, see below).

    Notebook 00 (where the time goes).
    """

    device: str
    peak_bytes: int = 0
    exact: bool = False


def _peak_rss_bytes() -> int:
    """This process's highest resident memory so far (Linux reports KiB, macOS bytes; 0 on Windows)."""
    if resource is None:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@contextmanager
def track_peak_memory(device) -> Iterator[PeakMemory]:
    """Measure how much extra memory a block of code needs at its peak, in bytes.

    Introduced in notebook 00 (where the time goes). Use it as

        with track_peak_memory(device) as mem:
            model.generate(...)
        print(mem.peak_bytes)

    On CUDA this is exact: PyTorch's peak counter is reset at the start and
    read at the end (`torch.cuda.max_memory_allocated`). On a CPU it is
    coarse: the operating system only reports the process's all-time peak
    resident memory (`resource.getrusage`), so the answer is how far the
    block pushed that peak up; a block that stays below an earlier peak
    reports 0, and Windows always reports 0. On an Apple GPU it is the
    memory still allocated at the end minus at the start, not a true peak.
    """
    device = pick_device(device)
    mem = PeakMemory(device=str(device), exact=device.type == "cuda")
    synchronize(device)
    if device.type == "cuda":
        # torch.cuda.reset_peak_memory_stats(device=None) -> None and memory_allocated(device=None)
        # -> int: the caching allocator's counters, tensors only (not its reserved pool, cuBLAS
        # workspaces or CUDA graphs' private pools), per device; checked in torch 2.13's docs.
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
    elif device.type == "mps":
        start = torch.mps.current_allocated_memory()
    else:
        start = _peak_rss_bytes()

    yield mem  # the with-block runs here; an exception in it skips the rest

    synchronize(device)
    if device.type == "cuda":
        end = torch.cuda.max_memory_allocated(device)       # (device=None) -> int, peak since the reset
    elif device.type == "mps":
        end = torch.mps.current_allocated_memory()
    else:
        end = _peak_rss_bytes()
    mem.peak_bytes = max(0, end - start)
