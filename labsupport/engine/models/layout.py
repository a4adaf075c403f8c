"""How each weight matrix is laid out in memory, measured rather than assumed.

Introduced in notebook 00 (where the time goes).

A decode step at batch 1 multiplies one vector by every weight matrix, so its
speed is how fast the matrix-vector kernel streams the weights from memory.
``nn.Linear`` keeps its weight as (out_features, in_features), row-major. The
same numbers can also be stored column-major (each input feature's column of
outputs contiguous, as GPT-2's ``Conv1D`` does): the shape stays
(out_features, in_features), only the strides change, and the BLAS library then
runs a different kernel. Which kernel is faster depends on the library, the CPU
and the dtype: on the 2-core AMD CPU where this course was built, MKL's fp32
matrix-vector product ran about twice as fast column-major, while bf16 was
faster row-major, and the best layout differed between matrix shapes. So
labsupport times both layouts once per (device, dtype, shape) and uses the
faster one; on a GPU it keeps the standard layout.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..linear_swap import swap_linears
from . import fused

LAYOUTS = ("row", "column")


def relayout(weight: torch.Tensor, layout: str) -> torch.Tensor:
    """The same (out, in) matrix stored row-major ("row") or column-major ("column").
    Notebook 00 (where the time goes)."""
    if layout == "row":
        return weight.contiguous()
    return weight.t().contiguous().t()           # (out, in) view of an (in, out) buffer


def _time_gemv(weights: list[torch.Tensor], x: torch.Tensor) -> float:
    for w in weights[:2]:
        F.linear(x, w)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        for w in weights:
            F.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


def preferred_layout(device: torch.device, dtype: torch.dtype,
                     shape: tuple[int, int] = (3072, 576)) -> str:
    """The faster layout for batch-1 matrix-vector products with an (out, in) weight
    of this shape, dtype and device: "row" on a GPU and for a matrix small enough to stay
    in the CPU's caches, else `measured_layout`'s answer.

    Notebook 00 (where the time goes).
    """
    device = torch.device(device)
    out_features, in_features = shape
    matrix_bytes = out_features * in_features * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or matrix_bytes < (1 << 20):
        return "row"                  # GPUs, and matrices small enough to stay in cache
    return measured_layout(device.type, dtype, (out_features, in_features))


@functools.cache
def measured_layout(device_type: str, dtype: torch.dtype, shape: tuple[int, int]) -> str:
    """Both layouts timed on matrices of this shape and dtype, the faster one returned: a
    pure function of its arguments on this machine, measured once per process (its first
    answer is its answer, so every model laid out in this process agrees; nothing is kept
    anywhere else). ``measured_layout.cache_clear()`` measures again.

    Enough copies of the matrix are timed to exceed the CPU caches, as in a real model
    whose weights stream from memory at every decode step. Notebook 00 (where the time goes).
    """
    out_features, in_features = shape
    matrix_bytes = out_features * in_features * torch.empty((), dtype=dtype).element_size()
    copies = min(64, max(2, (48 << 20) // matrix_bytes))
    with torch.inference_mode():
        weights = [torch.randn(shape, dtype=dtype, device=device_type) for _ in range(copies)]
        x = torch.randn(1, in_features, dtype=dtype, device=device_type)
        timings = {layout: _time_gemv([relayout(w, layout) for w in weights], x) for layout in LAYOUTS}
    return min(timings, key=timings.get)


def apply_layout(model: nn.Module, layout: str | None = None) -> dict[tuple[int, int], str]:
    """Store every float Linear weight of `model` in `layout`, or by default in the
    measured preference for its shape, dtype and device. Returns {shape: layout}.

    Introduced in notebook 00 (where the time goes). It is the layout argument of the
    linear swap (`linear_swap.swap_linears`), with no layer replaced and nothing to undo
    later. Tied weights (the embedding shared with the output projection) stay tied:
    the Parameter object is kept and only its storage changes.
    """
    chosen: dict[tuple[int, int], str] = {}

    def store(weight: torch.Tensor) -> torch.Tensor:
        shape = tuple(weight.shape)
        if shape not in chosen:
            chosen[shape] = layout or preferred_layout(weight.device, weight.dtype, shape)
        return relayout(weight, chosen[shape])

    swap_linears(model, layout=store)
    # loading a model onto a CPU builds (once per cache) and loads the fused norm, rotary and SwiGLU
    # kernels, so that no forward pass has to (fused.py); a GPU model builds nothing
    fused.prepare(next(model.parameters()).device)
    return chosen
