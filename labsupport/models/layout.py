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
faster row-major. So labsupport times both layouts once per (device, dtype) and
uses the faster one; on a GPU it keeps the standard layout.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYOUTS = ("row", "column")
_chosen: dict[tuple[str, torch.dtype], str] = {}


def relayout(weight: torch.Tensor, layout: str) -> torch.Tensor:
    """The same (out, in) matrix stored row-major ("row") or column-major ("column")."""
    if layout == "row":
        return weight.contiguous()
    return weight.t().contiguous().t()           # (out, in) view of an (in, out) buffer


def _time_gemv(weights: list[torch.Tensor], x: torch.Tensor) -> float:
    for w in weights[:2]:
        F.linear(x, w)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for w in weights:
            F.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


def preferred_layout(device: torch.device, dtype: torch.dtype) -> str:
    """The faster layout for batch-1 matrix-vector products on this device and dtype,
    timed once per process on matrices of the embedded model's MLP shape."""
    device = torch.device(device)
    if device.type != "cpu":
        return "row"
    key = (device.type, dtype)
    if key not in _chosen:
        with torch.inference_mode():
            # 16 matrices of 3072 x 576: more than a CPU cache holds, as in a real model
            weights = [torch.randn(3072, 576, dtype=dtype) for _ in range(16)]
            x = torch.randn(1, 576, dtype=dtype)
            timings = {layout: _time_gemv([relayout(w, layout) for w in weights], x)
                       for layout in LAYOUTS}
        _chosen[key] = min(timings, key=timings.get)
    return _chosen[key]


def apply_layout(model: nn.Module, layout: str | None = None) -> str:
    """Store every float Linear weight of `model` in `layout` (default: the measured
    preference for the model's device and dtype). Returns the layout used.

    Tied weights (the embedding shared with the output projection) stay tied.
    """
    first = next(model.parameters())
    layout = layout or preferred_layout(first.device, first.dtype)
    done: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.weight.is_floating_point():
                old = module.weight
                if id(old) not in done:
                    done[id(old)] = relayout(old.data, layout)
                old.data = done[id(old)]
    return layout
