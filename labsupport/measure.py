"""The one way this course times code and measures memory.

Introduced in notebook 00 (where the time goes). Every benchmark in the
course goes through these functions, so every number is taken the same way:

* warm-up calls first (the first call pays for allocation and compilation; on a GPU
  at least one, whatever the caller asks: there the first call compiles the decode step);
* the device is synchronized before and after each call (GPUs run
  asynchronously, so without it the clock stops before the work is done);
* several repeats, summarized by the median, with the spread shown too;
* when two versions are compared, their runs are interleaved
  (`time_side_by_side`), so a noisy moment hits both alike.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

from labsupport.errors import LabError
from labsupport.hardware import (as_dtype, bf16_supported, require_usable_dtype, device_name, dtype_name, fp16_fast,
                                 pick_device, synchronize)

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
    first call of a shape compiles and records the decode step (`generation.compile_by_default`)."""
    if repeats < 1 or warmup < 0:
        raise LabError(f"Got warmup={warmup}, repeats={repeats}; use warmup >= 0 and repeats >= 1.")
    return max(warmup, 1) if device.type == "cuda" else warmup


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call of fn, with the device idle before and finished after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_fn(fn: Callable[[], object], device, warmup: int = 1, repeats: int = 5) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `repeats` timed calls.

    Introduced in notebook 00 (where the time goes). The device is
    synchronized before and after every call, and the clock is
    `time.perf_counter`.
    """
    device = pick_device(device)
    for _ in range(_warmup_calls(warmup, repeats, device)):
        fn()
    synchronize(device)
    return Timing([_time_once(fn, device) for _ in range(repeats)])


def time_side_by_side(
    fns: dict[str, Callable[[], object]], device, warmup: int = 1, repeats: int = 5
) -> dict[str, Timing]:
    """Time several candidates fairly against each other; returns a Timing per name.

    Introduced in notebook 00 (where the time goes). Instead of timing A five
    times and then B five times, each round runs every candidate once, and the
    starting candidate rotates from round to round (A B C, then B C A, then
    C A B, ...). A slow moment of the machine then lands on all candidates
    alike, which is how every speed ratio in the course is measured.
    """
    if not fns:
        raise LabError("time_side_by_side got no functions; pass a dict such as {'name': fn}.")
    device = pick_device(device)
    warmup = _warmup_calls(warmup, repeats, device)
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    synchronize(device)

    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_time_once(fns[name], device))
    return {name: Timing(samples[name]) for name in names}


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


# --------------------------------------------------------------------------
# Measuring the two roofs: memory bandwidth and matmul speed
# --------------------------------------------------------------------------


# Default copy size for `measure_bandwidth`: far larger than any CPU cache,
# so the copy really goes to main memory.
CPU_COPY_BYTES = 256 * 2**20
CUDA_COPY_BYTES = 2**30


def default_copy_bytes(device) -> int:
    """The bandwidth probe's buffer: 256 MiB on a CPU; on CUDA 1 GiB, or an eighth of the free
    memory where less is free (a small GPU, a MIG slice), since the probe holds two buffers.

    Introduced in notebook 00 (where the time goes)."""
    device = pick_device(device)
    if device.type != "cuda":
        return CPU_COPY_BYTES
    free, _total = torch.cuda.mem_get_info(device)     # (device=None) -> (free, total) bytes, cudaMemGetInfo
    return int(min(CUDA_COPY_BYTES, free // 8))


def measure_bandwidth(device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s, from copying one buffer into another.

    Introduced in notebook 00 (where the time goes). Each copy reads
    `nbytes` and writes `nbytes`, so it moves 2 x nbytes. The default size
    (`default_copy_bytes`: 256 MiB on CPU, up to 1 GiB on CUDA) is far larger than
    any cache (an H100's L2 is 50 MB), so this is the speed of main memory, which
    is what a model's weights stream from. On CUDA `copy_` is one device-to-device
    kernel and `time_fn` synchronizes around it.
    Returns the median over `repeats` copies, after one warm-up copy.
    """
    device = pick_device(device)
    if nbytes is None:
        nbytes = default_copy_bytes(device)
    # Fill the source: reading never-touched memory can be served by the OS for free.
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    destination = torch.empty_like(source)
    timing = time_fn(lambda: destination.copy_(source), device, warmup=1, repeats=repeats)
    return 2 * nbytes / timing.median


def _default_matmul_size(device: torch.device, dtype: torch.dtype) -> int:
    """A matrix size that takes roughly 0.01-0.2 s, so the probe stays quick."""
    if device.type == "cuda":
        return 8192
    if device.type == "mps":
        return 4096
    emulated = (dtype == torch.bfloat16 and not bf16_supported(device)) or (
        dtype == torch.float16 and not fp16_fast(device)
    )
    return 256 if emulated else 1024  # emulated matmuls are ~100x slower


def measure_matmul_flops(device, dtype, n: int | None = None, repeats: int = 5) -> float:
    """Matrix-multiply speed in FLOP/s for an n x n by n x n product in `dtype`.

    Introduced in notebook 00 (where the time goes). The product costs
    2 n^3 floating-point operations (one multiply and one add per term).
    The default n is 8192 on CUDA and 1024 on a CPU (256 when the dtype is
    only emulated there). Returns the median over `repeats`, after one warm-up.
    """
    device = pick_device(device)
    dtype = as_dtype(dtype)
    if n is None:
        n = _default_matmul_size(device, dtype)
    # On CUDA, float32 matmuls stay in true fp32 unless torch.backends.cuda.matmul.allow_tf32
    # (default False since torch 1.12) is set, so this measures fp32, not TF32, units; fp16 and
    # bf16 use the tensor cores (bf16 only from capability 8.0: `require_usable_dtype` refuses it
    # before). 8192 x 8192 in fp32 holds 3 x 256 MiB, small for any CUDA GPU.
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timing = time_fn(lambda: a @ b, device, warmup=1, repeats=repeats)
    return 2 * n**3 / timing.median


# --------------------------------------------------------------------------
# The profile and the roofline
# --------------------------------------------------------------------------


def _human(value: float, unit: str) -> str:
    """Format 4.2e10 as "42.0 G" + unit."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


@dataclass
class HardwareProfile:
    """Measured limits of one device: the two roofs of a roofline plot.

    Introduced in notebook 00 (where the time goes).
    `bandwidth` is in bytes/s; `flops` maps a dtype name ("float32",
    "bfloat16", ...) to the measured matmul FLOP/s in that dtype.
    """

    device: str
    name: str
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)

    def _peak(self, dtype) -> float:
        """Measured FLOP/s for `dtype`, or a LabError saying how to measure it."""
        name = dtype_name(dtype)
        if name not in self.flops:
            raise LabError(
                f"{name} was not measured on this device; call probe(dtypes=[...]) with it included."
            )
        return self.flops[name]

    def ridge(self, dtype) -> float:
        """Arithmetic intensity (FLOP per byte) where the memory roof meets the compute roof.

        Work with fewer FLOP per byte than this is memory-bound; more, compute-bound.
        """
        return self._peak(dtype) / self.bandwidth

    def attainable(self, intensity: float, dtype) -> float:
        """Best FLOP/s possible at `intensity` FLOP per byte: min(peak, bandwidth x intensity)."""
        return min(self._peak(dtype), self.bandwidth * intensity)

    def to_dict(self) -> dict:
        """A plain dict (for JSON, or a table in a notebook)."""
        return asdict(self)

    def __str__(self) -> str:
        parts = [f"{self.name} [{self.device}]: memory {_human(self.bandwidth, 'B/s')}"]
        for name, flops in self.flops.items():
            parts.append(f"{name} {_human(flops, 'FLOP/s')} (ridge {self.ridge(name):.1f} FLOP/B)")
        return " | ".join(parts)


def _default_probe_dtypes(device: torch.device) -> list[torch.dtype]:
    """float32 always, bfloat16 where the hardware has it (emulated bf16 is left out of
    the roofline: notebook 03 measures what emulation costs), float16 on CUDA."""
    dtypes = [torch.float32]
    if bf16_supported(device):
        dtypes.append(torch.bfloat16)
    if device.type == "cuda":
        dtypes.append(torch.float16)
    return dtypes


# Profiles already measured in this Python process, keyed by
# (device, dtype names). Measuring takes a few seconds and the hardware does
# not change, so every notebook cell that calls `probe()` reuses the first
# answer. Pass refresh=True to measure again (say, after closing other programs).
_PROBE_CACHE: dict[tuple[str, tuple[str, ...]], HardwareProfile] = {}


def probe(device=None, dtypes=None, refresh: bool = False) -> HardwareProfile:
    """Measure memory bandwidth and matmul speed of a device and return a `HardwareProfile`.

    Introduced in notebook 00 (where the time goes). `device` defaults to
    `pick_device()`. `dtypes` defaults to float32, plus bfloat16 where the
    hardware has it, plus float16 on CUDA; each is checked with `require_usable_dtype`.
    Results are remembered per (device, dtypes) for the rest of the session;
    `refresh=True` measures again. Takes a few seconds on a 2-core CPU.
    """
    device = pick_device(device)
    dtypes = [as_dtype(d) for d in (dtypes or _default_probe_dtypes(device))]
    for dtype in dtypes:
        require_usable_dtype(device, dtype)

    key = (str(device), tuple(dtype_name(d) for d in dtypes))
    if refresh or key not in _PROBE_CACHE:
        _PROBE_CACHE[key] = HardwareProfile(
            device=str(device),
            name=device_name(device),
            bandwidth=measure_bandwidth(device),
            flops={dtype_name(d): measure_matmul_flops(device, d) for d in dtypes},
        )
    return _PROBE_CACHE[key]
