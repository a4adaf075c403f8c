"""W4A8 on the CPU: int4 weights times int8 activations, with integer dot products.

Introduced in notebook 04 (quantization).

The weights are our int4 groupwise format with groups of 32 (formats.py: q in 0..15,
w ~ q * scale + zero), which is GGUF's Q4_1 block. Each activation row is quantized per call
to int8 in blocks of 32 (symmetric: dx = max|x| / 127), so that one block's contribution is

    sum_i w_i x_i ~ scale * dx * sum_i q_i * qx_i  +  zero * dx * sum_i qx_i

The first sum is all integers, which the CPU computes 32 or 64 byte products at a time
(AVX2, AVX-VNNI, AVX512-VNNI; a portable loop elsewhere): w4a8.cpp, beside this file, says how.

This module builds that C++ kernel on first use (torch.utils.cpp_extension, 10 to 60 s,
cached under the course's cache directory), packs weights for it, calls it, and gives the same
computation in plain torch (`lab.quantization_error.w4a8_reference`) to check it against. Without a C++ compiler or
ninja, or if the build fails, `w4a8_unavailable()` says why in one sentence, and the caller keeps
the older kernel.

Environment variables:
  LABSUPPORT_W4A8_PATH  forces a path for `w4a8_linear(path=None)`: portable, avx2, avxvnni, avx512vnni
  ATEN_CPU_CAPABILITY   torch's own cap (avx2, default) caps the path too, unless the first one is set
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from ...errors import LabError, first_line
from ..cache_dir import cache_root
from ..cpp_build import try_build

SOURCE = Path(__file__).with_name("w4a8.cpp")
BLOCK = 32                                   # input features per block, weights and activations
PATHS = ("portable", "avx2", "avxvnni", "avx512vnni")
FP16_MAX = 65504.0


# --- building the extension (cpp_build.py) ---------------------------------------------------

def _try_build(source: Path, kernels_dir: Path) -> str | None:
    """Build and load the W4A8 kernel from `source`; None when loaded, else why (one sentence)."""
    return try_build(source, kernels_dir, "the W4A8 kernel", "w4a8")


def _fake_w4a8_linear(x, packed, scales, mins, path="auto"):
    """The op's output without computing it (shape and dtype), for torch.compile's tracing."""
    return x.new_empty((*x.shape[:-1], packed.shape[0]))             # (..., n)


@functools.cache
def _load() -> str | None:
    """Build (first time) and load the kernel once per process; the reason it failed, or None."""
    reason = _try_build(SOURCE, cache_root() / "kernels")
    if reason is None:
        torch.library.register_fake("labsupport::w4a8_linear")(_fake_w4a8_linear)
    return reason


def w4a8_unavailable() -> str | None:
    """Why the W4A8 kernel cannot run here (one sentence, no final period), or None when it can.

    Introduced in notebook 04 (quantization). The first call builds the C++ kernel (or loads
    the build cached under LABSUPPORT_CACHE/kernels) and prints the build time when it builds.
    """
    return _load()


def _require_kernel() -> None:
    reason = _load()
    if reason is not None:
        raise LabError(f"The W4A8 kernel is not available: {reason}.")


def supported_paths() -> tuple[str, ...]:
    """The W4A8 paths this CPU runs, slowest first: ("portable", "avx2", ...). Notebook 04
    (quantization). Asked of the kernel itself (__builtin_cpu_supports), so it builds it first."""
    _require_kernel()
    return tuple(torch.ops.labsupport.w4a8_paths())


def gemm_min_rows() -> int:
    """From how many activation rows the SIMD paths multiply in weight tiles of one row per lane
    (16 in 512 bits, 8 in 256), each unpacked once for all the rows (a batch, a prefill), instead
    of 4-row tiles unpacked again for every 4 activation rows; the portable path never does.
    Notebook 04 (quantization); w4a8.cpp's GEMM_MIN_ROWS says how it was chosen."""
    _require_kernel()
    return int(torch.ops.labsupport.w4a8_gemm_min_rows())


# --- weights: pack our int4 groups (g = 32) into the kernel's layout ---------------------------

def pack_q4_1(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor):
    """Our int4 groups of 32 -> the kernel's layout. Notebook 04 (quantization).

    q: (n, k) values 0..15, scales and mins: (n, k / 32), as `quantize_int4_groupwise(w, 32)`
    returns them (w ~ q * scale + min); k must be a multiple of 32 (pad the weight's columns with
    zeros first, as Int4Linear does). Returns (packed, scales, mins): packed uint8 (n, k / 2),
    per block of 32 sixteen bytes, byte j = q[j] | q[j + 16] << 4; scales and mins float16 (n, k / 32).
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.is_floating_point() or q.is_complex():
        raise LabError("pack_q4_1 takes q as a 2-D integer tensor (out_features, in_features) of values 0..15.")
    n, k = q.shape
    if k == 0 or k % BLOCK:
        raise LabError(f"pack_q4_1 needs in_features to be a multiple of {BLOCK}, got {k}; "
                       f"pad the weight with zero columns to {-(-max(k, 1) // BLOCK) * BLOCK} first.")
    for name, t in (("scales", scales), ("mins", mins)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != (n, k // BLOCK):
            raise LabError(f"pack_q4_1 needs {name} as a float tensor of shape ({n}, {k // BLOCK}) "
                           f"(one per group of {BLOCK}), got {getattr(t, 'shape', type(t).__name__)}.")
        if t.numel() and not bool(t.float().abs().max() <= FP16_MAX):
            raise LabError(f"pack_q4_1 stores {name} in float16, and some are not finite or beyond {FP16_MAX:g}.")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise LabError("pack_q4_1 takes q values 0..15 (4 bits); quantize with quantize_int4_groupwise(w, 32).")
    halves = q.to(torch.uint8).reshape(n, k // BLOCK, 2, BLOCK // 2)            # (n, blocks, half, 16)
    packed = halves[:, :, 0, :] | (halves[:, :, 1, :] << 4)                     # (n, blocks, 16)
    packed = packed.reshape(n, k // 2).contiguous()                             # (n, k/2)
    return packed, scales.to(torch.float16).contiguous(), mins.to(torch.float16).contiguous()


def unpack_q4_1(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_q4_1`'s nibbles: uint8 (n, k / 2) -> q uint8 (n, k) values 0..15.
    Notebook 04 (quantization)."""
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, BLOCK // 2)                                  # (n, blocks, 16)
    halves = torch.stack([blocks & 0x0F, blocks >> 4], dim=2)                   # (n, blocks, 2, 16)
    return halves.reshape(n, -1)                                                # (n, k)


# --- calling the kernel -------------------------------------------------------------------------

def default_path() -> str:
    """The path `w4a8_linear(path=None)` and new int4 layers take: $LABSUPPORT_W4A8_PATH, else the
    cap torch's own kernels are held to (ATEN_CPU_CAPABILITY=avx2: "avx2", =default: "portable";
    CI's AVX2-laptop simulation sets it), else "auto" (the fastest this CPU runs). Notebook 04."""
    forced = os.environ.get("LABSUPPORT_W4A8_PATH", "").strip()
    if forced:
        return forced
    return {"avx2": "avx2", "default": "portable"}.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower(),
                                                       "auto")


def w4a8_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                path: str | None = "auto") -> torch.Tensor:
    """y = x @ W.T with W the packed int4 weight, x quantized to int8 per block of 32 on the way.
    Notebook 04 (quantization).

    x: (..., k) floating point (computed in float32, returned in x's dtype); packed, scales, mins
    from `pack_q4_1`; path: "auto", "portable", "avx2", "avxvnni" or "avx512vnni" (None: `default_path()`).
    Returns (..., n). Threads: torch's (torch.set_num_threads), over output rows. A mistake in the
    arguments raises one LabError sentence. A model's layers may call
    torch.ops.labsupport.w4a8_linear directly (same arguments, path a string), skipping this wrapper.
    """
    _require_kernel()
    try:
        return torch.ops.labsupport.w4a8_linear(x, packed, scales, mins, default_path() if path is None else path)
    except (RuntimeError, TypeError) as error:
        raise LabError(first_line(error, limit=300) + ".") from None


# --- the same computation in plain torch --------------------------------------------------------

def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x to int8 per block of 32, exactly as the kernel does. Notebook 04 (quantization).

    x: (M, k), k a multiple of 32. Returns qx int8 (M, k) in -127..127 and dx float32 (M, k / 32),
    x ~ qx * dx: dx = max|x| / 127 per block, qx = round(x * (1 / dx)) (half to even), 0 where dx = 0.
    """
    M, k = x.shape
    blocks = x.float().reshape(M, k // BLOCK, BLOCK)                            # (M, blocks, 32)
    dx = blocks.abs().amax(dim=-1) / 127                                        # (M, blocks)
    inverse = torch.where(dx > 0, 1 / dx, torch.zeros_like(dx))
    qx = torch.round(blocks * inverse[..., None]).clamp(-127, 127).to(torch.int8)  # (M, blocks, 32)
    return qx.reshape(M, k), dx
