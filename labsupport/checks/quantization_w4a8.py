"""Checker for notebook 04's W4A8 exercise: int4 weights times int8 activations, one integer sum
per block of 32 (section 8, the arithmetic of llama.cpp's kernel and of engine/quant/w4a8.cpp).

Introduced in notebook 04 (quantization). Like the other checkers of notebook 04
(`checks.quantization`), it compares the learner's function with the package's reference
(`engine.quant.w4a8`) on inputs chosen so that each usual slip gives another answer.
"""

from __future__ import annotations

import torch

from torch.overrides import TorchFunctionMode

from ..engine.quant import dequantize_int4, quantize_int4_groupwise
from ..engine.quant.w4a8 import pack_q4_1, quantize_activations
from ..lab.quantization_error import w4a8_reference
from . import fail, grades_quietly, passed, refuses_references
from .quantization import _as_tensor, _call


# --- W4A8: int4 weights times int8 activations, one integer sum per block --------------------------

def _w4a8_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, w) pairs: batch 1 and 3, an odd number of outputs, k = 64 and 96 (not a multiple of
    256), and activations with one large value per row, so that a scale per row (not per block)
    and activations left in float both give other numbers."""
    generator = torch.Generator().manual_seed(48)
    cases = []
    for rows, n, k in ((1, 7, 64), (3, 5, 96)):
        x = torch.randn(rows, k, generator=generator)
        x[:, 3] = 20.0                                              # dominates the first block's scale
        cases.append((x, torch.randn(n, k, generator=generator) * 0.05))
    return cases


def _w4a8_hint(x, q, scales, mins, y, expected) -> str:
    """The usual slip behind wrong W4A8 outputs, tried one by one."""
    k = x.shape[1]
    w_hat = dequantize_int4(q, scales, mins)                                    # (n, k)
    qx, dx = quantize_activations(x)
    blocks = qx.float().reshape(x.shape[0], -1, 32) * dx[..., None]             # (M, blocks, 32)
    no_min = blocks.reshape(x.shape[0], k) @ dequantize_int4(q, scales, torch.zeros_like(mins)).T
    row_dx = x.abs().amax(dim=1, keepdim=True) / 127                             # (M, 1): one scale per row
    per_row = torch.round(x / row_dx).clamp(-127, 127) * row_dx @ w_hat.T
    if torch.allclose(y, x @ w_hat.T, rtol=1e-5, atol=1e-5):
        return ("the activations were not quantized: this is the float product. Quantize each block of 32 "
                "values of x to int8 (dx = max|x| / 127 per block) and sum integer products.")
    if torch.allclose(y, no_min, rtol=1e-4, atol=1e-4):
        return "the minimum's term is missing: add min * dx * sum(qx) for each block (w = q * scale + min)."
    if torch.allclose(y, per_row, rtol=1e-4, atol=1e-4):
        return "one activation scale per row: take dx per block of 32 values, as the weights have theirs."
    return ("per block: y += scale * dx * sum(q * qx) + min * dx * sum(qx), with qx = round(x / dx) in -127..127 "
            f"and dx = max|x| / 127 over the block's 32 values; expected starting {expected[0, :3].tolist()}.")


MATMULS = ("__matmul__", "__rmatmul__", "matmul", "mm", "bmm", "linear", "addmm", "einsum", "tensordot",
           "inner", "dot", "mv", "baddbmm")


class FloatMatmuls(TorchFunctionMode):
    """Records the float matmuls the learner's code made along the full length k: a W4A8 answer
    makes none (its products are integers, summed per block of 32), a float matmul of the
    dequantized values makes one. Notebook 04 (quantization), exercise 4."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.found = k, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in MATMULS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [a for a in args if isinstance(a, (list, tuple)) for a in a if isinstance(a, torch.Tensor)]
            if any(t.is_floating_point() for t in tensors) and any(t.dim() and t.shape[-1] == self.k for t in tensors):
                self.found.append(name)
        return func(*args, **(kwargs or {}))


@grades_quietly
@refuses_references("W4A8 matmul", w4a8_reference, dequantize_int4)
def check_w4a8_matmul(matmul_fn) -> None:
    """Check a learner's `matmul_fn(x, q, scales, mins) -> (y, sums)`: x float (M, k), q uint8 (n, k)
    in 0..15 with scales and mins (n, k / 32) (int4 in groups of 32, w = q * scale + min); sums the
    integer block sums (M, n, k / 32), sum over each block of q * qx with x quantized to int8 per
    block of 32 (dx = max|x| / 127, qx = round(x / dx)); y (M, n) = sum over blocks of
    scale * dx * sums + min * dx * sum(qx).

    Introduced in notebook 04 (quantization). The sums must be integers and exactly the
    reference's (`w4a8.quantize_activations`), so that a float matmul of dequantized weights
    and activations, the right numbers by another method, is refused; y must match the float64
    reference of the same arithmetic (`lab.quantization_error.w4a8_reference`) to float32 rounding. A y computed by
    a float matmul along k (beside right integer sums) is refused, and so is a call of
    `w4a8_reference` or `dequantize_int4`.
    """
    exercise = "W4A8: int8 activations, one integer sum per block"
    cases = _w4a8_cases()
    for number, (x, w) in enumerate(cases, 1):
        case = f"{exercise} (case {number}: x {tuple(x.shape)}, weight {tuple(w.shape)})"
        q, scales, mins = quantize_int4_groupwise(w, 32)
        scales, mins = scales.half().float(), mins.half().float()             # as the kernel stores them
        with FloatMatmuls(x.shape[1]) as record:
            answer = _call(matmul_fn, (x.clone(), q.clone(), scales.clone(), mins.clone()), case, "(y, sums)",
                           "cut x and q into blocks of 32 along k: x.reshape(M, k // 32, 32), q.reshape(n, k // 32, 32).")
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            fail(case, "a pair (y, sums)", type(answer).__name__, "end with `return y, sums`")
        y, sums = (_as_tensor(t, name, case) for t, name in zip(answer, ("y", "sums")))
        qx, _ = quantize_activations(x)
        expected_sums = torch.einsum("mbi,nbi->mnb", qx.reshape(x.shape[0], -1, 32).long(),
                                     q.reshape(w.shape[0], -1, 32).long())     # (M, n, blocks)
        if sums.is_floating_point() or sums.is_complex():
            fail(case, "sums as an integer tensor (torch.int32 or int64)", f"dtype {sums.dtype}",
                 "the point of W4A8 is integer arithmetic: multiply qx (int8) by q (0..15) as integers "
                 "(.to(torch.int32) first: int8 products overflow) and sum each block.")
        if tuple(sums.shape) != tuple(expected_sums.shape) or not torch.equal(sums.long(), expected_sums):
            wrapped = sums.shape == expected_sums.shape and torch.equal(
                sums.long(), ((expected_sums + 128) % 256) - 128)
            row_dx = x.abs().amax(dim=1, keepdim=True) / 127                     # (M, 1): a scale per row
            row_qx = torch.round(x / row_dx).clamp(-127, 127).long().reshape(x.shape[0], -1, 32)
            per_row = sums.shape == expected_sums.shape and torch.equal(
                sums.long(), torch.einsum("mbi,nbi->mnb", row_qx, q.reshape(w.shape[0], -1, 32).long()))
            hint = ("the sums wrapped around: int8 (or uint8) products overflow; convert to torch.int32 before "
                    "multiplying." if wrapped else
                    "one activation scale per row: take dx per block of 32 values (x.reshape(M, k // 32, 32)), "
                    "as the weights have theirs, so that one large value only coarsens its own block." if per_row else
                    "qx = round(x / dx) clamped to -127..127, dx = max|x| / 127 per block of 32 (per row and "
                    "block), and sums[m, j, b] = sum over the block's 32 positions of q[j] * qx[m]: shape (M, n, k / 32).")
            fail(case, f"sums of shape {tuple(expected_sums.shape)} starting {expected_sums.flatten()[:3].tolist()}",
                 f"shape {tuple(sums.shape)} starting {sums.flatten()[:3].tolist()}", hint)
        if record.found:
            fail(case, "y computed from the integer block sums", f"a float {record.found[0]} along k = {x.shape[1]}",
                 "build y from sums: y = (scales * dx * sums).sum(-1) + (mins * dx * qx.sum(-1)).sum(-1), per block.")
        packed, s16, m16 = pack_q4_1(q, scales, mins)
        expected = w4a8_reference(x, packed, s16, m16)                            # (M, n)
        y = y.float()
        if y.shape != expected.shape or not torch.allclose(y, expected, rtol=1e-5, atol=1e-5):
            hint = (_w4a8_hint(x, q, scales, mins, y, expected) if y.shape == expected.shape else
                    "y is (M, n): one output per row of x and per output feature.")
            fail(case, f"y of shape {tuple(expected.shape)} starting {expected[0, :3].tolist()}",
                 f"shape {tuple(y.shape)} starting {y.flatten()[:3].tolist()}", hint)
    passed(exercise, f"Checked on {len(cases)} layers, batches 1 and 3: integer block sums exact, outputs to "
                     f"float rounding.")
