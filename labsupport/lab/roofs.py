"""The two roofs of this machine: memory bandwidth and matmul speed, measured.

Introduced in notebook 00 (where the time goes). A decode step cannot run faster than
its bytes stream from memory, nor than its arithmetic runs on the matmul units; the
two probes here measure both limits on this machine (`probe` returns a
`HardwareProfile`), and roofline.py puts every measured step under them.

The copy probe is repeated (`BANDWIDTH_REPEATS`) and summarized by its median, with the
spread of the repeats kept beside it (`HardwareProfile.bandwidth_spread`): on a shared
machine the bandwidth a program gets moves from moment to moment, and a fraction of
bandwidth reached means little unless the bandwidth behind it was steady.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..errors import LabError
from ..engine.hardware import (as_dtype, bf16_supported, device_name, dtype_name, fp16_fast, pick_device,
                               require_usable_dtype)
from .measure import Timing, time_fn


# --------------------------------------------------------------------------
# Measuring the two roofs: memory bandwidth and matmul speed
# --------------------------------------------------------------------------


# Default copy size for `measure_bandwidth`: far larger than any CPU cache,
# so the copy really goes to main memory.
CPU_COPY_BYTES = 256 * 2**20
CUDA_COPY_BYTES = 4 * 2**30       # an H200 copies it in about 2 ms: long against the events' resolution


def default_copy_bytes(device) -> int:
    """The bandwidth probe's buffer: 256 MiB on a CPU; on CUDA 4 GiB, or an eighth of the free
    memory where less is free (a T4, a MIG slice), since the probe holds two buffers and the
    notebook's models stay loaded beside them.

    Introduced in notebook 00 (where the time goes)."""
    device = pick_device(device)
    if device.type != "cuda":
        return CPU_COPY_BYTES
    free, _total = torch.cuda.mem_get_info(device)     # (device=None) -> (free, total) bytes, cudaMemGetInfo
    return int(min(CUDA_COPY_BYTES, free // 8))


BANDWIDTH_REPEATS = 9       # copies timed per probe (after two warm-up copies)


def copy_timing(device, nbytes: int | None = None, repeats: int = BANDWIDTH_REPEATS) -> tuple[int, Timing]:
    """Time copying one buffer of `nbytes` bytes into another: (nbytes, the `Timing`).

    Introduced in notebook 00 (where the time goes). `measure_bandwidth` turns it into
    bytes/s; the bench also interleaves it with decode runs, so that a fraction of
    bandwidth compares two things measured at the same moments.
    """
    device = pick_device(device)
    if nbytes is None:
        nbytes = default_copy_bytes(device)
    # Fill the source: reading never-touched memory can be served by the OS for free.
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    destination = torch.empty_like(source)
    return nbytes, time_fn(lambda: destination.copy_(source), device, warmup=2, repeats=repeats)


def copy_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes/s of one copy of `nbytes` bytes that took `seconds`: it reads them and writes them.
    Introduced in notebook 00 (where the time goes)."""
    return 2 * nbytes / seconds


def read_timing(device, nbytes: int | None = None, repeats: int = BANDWIDTH_REPEATS) -> tuple[int, Timing]:
    """Time reading one buffer of `nbytes` bytes and writing nothing back: a sum over its float32
    values, on torch's threads (the decode's own count): (nbytes, the `Timing`).

    Introduced in notebook 00 (where the time goes). A decode step only reads its weights, and a
    copy also writes, so the read probe is the limit a decode step is set against (issue 54); the
    copy probe stays beside it. `read_bandwidth` turns the time into bytes/s."""
    device = pick_device(device)
    if nbytes is None:
        nbytes = default_copy_bytes(device)
    values = torch.ones(nbytes // 4, dtype=torch.float32, device=device)    # filled: really in memory
    return values.nbytes, time_fn(lambda: values.sum(), device, warmup=2, repeats=repeats)


def read_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes/s of one read of `nbytes` bytes that took `seconds`. Notebook 00 (where the time goes)."""
    return nbytes / seconds


# One chunk per thread of this many float32 values: torch's grain size (at::internal::GRAIN_SIZE), the
# smallest piece an elementwise operator hands to a thread of its own.
GRAIN_VALUES = 32768


def fork_join_seconds(repeats: int = 2000) -> float:
    """Seconds torch's CPU threads take to wake for one parallel region and join again.

    Introduced in notebook 00 (where the time goes), for `roofline_step_gap`. Every matmul of a
    decode step is one parallel region. A fill of one grain per thread is timed on all of torch's
    threads (t_all) and on one (t_one, where no thread is woken); the work splits evenly, so the
    wake-up is t_all - t_one / threads. 0 on one thread."""
    threads = torch.get_num_threads()
    if threads < 2:
        return 0.0
    values = torch.empty(threads * GRAIN_VALUES, dtype=torch.float32)      # one grain per thread
    fill = lambda: values.fill_(1.0)                                        # noqa: E731
    all_threads = time_fn(fill, "cpu", warmup=50, repeats=repeats).median
    torch.set_num_threads(1)
    try:
        one_thread = time_fn(fill, "cpu", warmup=50, repeats=repeats).median
    finally:
        torch.set_num_threads(threads)
    return max(all_threads - one_thread / threads, 0.0)


def measure_bandwidth(device, nbytes: int | None = None, repeats: int = BANDWIDTH_REPEATS) -> float:
    """Memory bandwidth in bytes/s, from copying one buffer into another.

    Introduced in notebook 00 (where the time goes). Each copy reads
    `nbytes` and writes `nbytes`, so it moves 2 x nbytes. The default size
    (`default_copy_bytes`: 256 MiB on CPU, up to 4 GiB on CUDA) is far larger than
    any cache (an H100's L2 is 50 MB), so this is the speed of main memory, which
    is what a model's weights stream from. On CUDA `copy_` is one device-to-device
    kernel, timed by CUDA events (`measure.time_fn`).
    Returns the median over `repeats` copies, after two warm-up copies (`copy_timing`).
    """
    nbytes, timing = copy_timing(device, nbytes, repeats)
    return copy_bandwidth(nbytes, timing.median)


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
    `bandwidth` is in bytes/s (the median copy); `flops` maps a dtype name ("float32",
    "bfloat16", ...) to the measured matmul FLOP/s in that dtype; `bandwidth_spread` is
    the copies' interquartile range over their median (0 where not measured);
    `read_bandwidth` is in bytes/s of a read that writes nothing (`read_timing`, the median
    sum; 0 where not measured): the limit of a decode step, which only reads (issue 54).
    """

    device: str
    name: str
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)
    bandwidth_spread: float = 0.0
    read_bandwidth: float = 0.0

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

    def bandwidth_fractions(self, bytes_per_s: float) -> dict:
        """A decode's bytes/s as fractions of both probes: read_bandwidth_fraction, against the read
        (the limit a decode is set against; None where no read was measured), and bandwidth_fraction,
        against the copy. Every bench section reports both (issue 54); `fraction_words` says them."""
        return {"read_bandwidth_fraction": bytes_per_s / self.read_bandwidth if self.read_bandwidth else None,
                "bandwidth_fraction": bytes_per_s / self.bandwidth}

    def to_dict(self) -> dict:
        """A plain dict (for JSON, or a table in a notebook)."""
        return asdict(self)

    def __str__(self) -> str:
        spread = f" (±{self.bandwidth_spread / 2:.0%})" if self.bandwidth_spread else ""
        read = f", read {_human(self.read_bandwidth, 'B/s')}" if self.read_bandwidth else ""
        parts = [f"{self.name} [{self.device}]: memory {_human(self.bandwidth, 'B/s')}{spread}{read}"]
        for name, flops in self.flops.items():
            parts.append(f"{name} {_human(flops, 'FLOP/s')} (ridge {self.ridge(name):.1f} FLOP/B)")
        return " | ".join(parts)


def fraction_words(fractions: dict) -> str:
    """"40% of read bandwidth (35% of copy)" from `HardwareProfile.bandwidth_fractions`'s dict (or a
    row holding its two keys); "35% of copy bandwidth" where no read was measured (an older report).
    Introduced in notebook 00 (where the time goes)."""
    read, copy = fractions.get("read_bandwidth_fraction"), fractions["bandwidth_fraction"]
    return f"{copy:.0%} of copy bandwidth" if read is None else f"{read:.0%} of read bandwidth ({copy:.0%} of copy)"


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
    """Measure memory bandwidth (a copy, and a read that writes nothing) and matmul speed of a
    device and return a `HardwareProfile`.

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
        nbytes, copies = copy_timing(device)
        read_bytes, reads = read_timing(device, nbytes)
        _PROBE_CACHE[key] = HardwareProfile(
            device=str(device),
            name=device_name(device),
            bandwidth=copy_bandwidth(nbytes, copies.median),
            flops={dtype_name(d): measure_matmul_flops(device, d) for d in dtypes},
            bandwidth_spread=copies.spread / copies.median,
            read_bandwidth=read_bandwidth(read_bytes, reads.median),
        )
    return _PROBE_CACHE[key]
