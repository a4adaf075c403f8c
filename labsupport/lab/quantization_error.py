"""What quantizing costs, and the float references the int4 kernel is checked against.

Introduced in notebook 04 (quantization). The engine's formats and kernels (engine/quant/)
only run; measuring them lives here: the error a format leaves in a weight matrix
(`weight_error_stats`), the bytes bitsandbytes keeps beside its weights (`bnb_side_bytes`),
and what the W4A8 kernel computes, in plain float64 torch (`w4a8_reference`), with the size
its float rounding is relative to (`w4a8_error_bound`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..engine.quant.bnb import bnb_roundtrip
from ..engine.quant.formats import (dequantize_int4, dequantize_int8, quantize_int4_groupwise,
                                    quantize_int8_absmax, require_weight_matrix)
from ..engine.quant.w4a8 import BLOCK, quantize_activations, unpack_q4_1
from ..errors import LabError


def weight_error_stats(w: torch.Tensor, method: str = "int8", group_size: int = 32) -> dict:
    """What quantizing `w` costs: the error tensor (dequantized - w, same shape) and its
    summary (max and mean absolute error, relative Frobenius error, bits per weight).
    method: "int8", "int4", or a bitsandbytes method "bnb-nf4" / "bnb-fp4". Notebook 04 (quantization)."""
    require_weight_matrix(w)
    w = w.detach().float()
    if method == "int8":
        q, scale = quantize_int8_absmax(w)
        approx, bits = dequantize_int8(q, scale), 8 + 32 / w.shape[1]
    elif method == "int4":
        q, scales, zeros = quantize_int4_groupwise(w, group_size)
        approx, bits = dequantize_int4(q, scales, zeros), 4 + 2 * 32 / group_size
    elif method in ("bnb-nf4", "bnb-fp4"):
        approx, bits = bnb_roundtrip(w, method.removeprefix("bnb-")), 4 + 32 / 64
    else:
        raise LabError(f"Unknown method {method!r} for weight_error_stats; use int8, int4, bnb-nf4 or bnb-fp4.")
    error = approx - w
    return {"error": error, "max_abs": error.abs().max().item(), "mean_abs": error.abs().mean().item(),
            "relative_frobenius": (error.norm() / w.norm().clamp(min=1e-12)).item(),
            "bits_per_weight": bits}


def bnb_side_bytes(module: nn.Module) -> int:
    """Bytes bitsandbytes keeps outside parameters and buffers (0 for other modules):
    LLM.int8()'s per-row scales (SCB), the 4-bit layers' block absmax and code book.
    Notebook 04 (quantization)."""
    weight = getattr(module, "weight", None)
    total = 0
    scb = getattr(weight, "SCB", None)
    if isinstance(scb, torch.Tensor):
        total += scb.nbytes
    state = getattr(weight, "quant_state", None)
    while state is not None:
        for name in ("absmax", "code", "offset"):
            tensor = getattr(state, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.nbytes
        state = getattr(state, "state2", None)
    return total


def w4a8_reference(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """What `w4a8_linear` computes, in plain torch: the matmul of the dequantized int8
    activations and the dequantized int4 weights, in float64. Notebook 04 (quantization).

    Same arguments as `w4a8_linear` (x: (..., k)); returns (..., n) float32. The kernel's integer
    sums are exact, so it differs from this only by float32 rounding of the scale terms.
    """
    k = packed.shape[1] * 2
    x2 = x.reshape(-1, k)                                                       # (M, k)
    qx, dx = quantize_activations(x2)
    x_hat = qx.double().reshape(x2.shape[0], -1, BLOCK) * dx.double()[..., None]   # (M, blocks, 32)
    q = unpack_q4_1(packed).double().reshape(packed.shape[0], -1, BLOCK)        # (n, blocks, 32)
    w_hat = q * scales.double()[..., None] + mins.double()[..., None]           # (n, blocks, 32)
    y = x_hat.reshape(x2.shape[0], k) @ w_hat.reshape(packed.shape[0], k).T     # (M, n)
    return y.float().reshape(*x.shape[:-1], packed.shape[0])                    # (..., n)


def w4a8_error_bound(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """The size the kernel's float rounding is relative to: per output, the sum over blocks of
    |d * dx * sum(q * qx)| + |m * dx * sum(qx)| (bounded above by a matmul of absolute values).
    Notebook 04 (quantization): the kernel and `w4a8_reference` agree to ~1e-6 of this; (..., n) float32."""
    k = packed.shape[1] * 2
    x2 = x.reshape(-1, k)                                                       # (M, k)
    qx, dx = quantize_activations(x2)
    x_abs = qx.double().abs().reshape(x2.shape[0], -1, BLOCK) * dx.double()[..., None]  # (M, blocks, 32)
    q = unpack_q4_1(packed).double().reshape(packed.shape[0], -1, BLOCK)        # (n, blocks, 32)
    w_abs = q * scales.double().abs()[..., None] + mins.double().abs()[..., None]    # (n, blocks, 32)
    y = x_abs.reshape(x2.shape[0], k) @ w_abs.reshape(packed.shape[0], k).T     # (M, n)
    return y.float().reshape(*x.shape[:-1], packed.shape[0])                    # (..., n)

