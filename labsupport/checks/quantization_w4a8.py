"""Checker for notebook 04's W4A8 exercise: int4 weights times int8 activations, one integer sum
per block of 32 (section 8, the arithmetic of llama.cpp's kernel and of engine/quant/w4a8.cpp).

Introduced in notebook 04 (quantization). Like the other checkers of notebook 04
(`checks.quantization`), it compares the learner's function with the package's reference
(`engine.quant.w4a8`) on inputs chosen so that each usual slip gives another answer. The method is
graded too: the float path (the dequantized weights q * scale + min times the dequantized
activations qx * dx, whole or block by block) gives the right numbers to float rounding, so the
checker watches the tensors the learner's code builds (`W4A8Watch`), and one layer's groups sit far
from zero, where float32's float path is detectably less exact than the integer sums.
"""

from __future__ import annotations

import torch

from torch.overrides import TorchFunctionMode

from ..engine.quant import dequantize_int4, quantize_int4_groupwise
from ..engine.quant.w4a8 import pack_q4_1, quantize_activations
from ..lab.quantization_error import w4a8_reference
from . import fail, grades_quietly, passed
from .grading import Exercise, graded, refusal
from .quantization import _as_tensor, _call

EXERCISE = "W4A8: int8 activations, one integer sum per block"
W4A8 = Exercise(
    title=EXERCISE,
    teaches="the W4A8 block dot product: integer sums of the 4-bit weights times the 8-bit activations, "
            "block by block of 32, scaled once per block",
    computed_by=("labsupport.engine.quant.w4a8.w4a8_linear", "labsupport.engine.quant.w4a8.quantize_activations",
                 "labsupport.engine.quant.formats.dequantize_int4", "labsupport.engine.quant.kernels.Int4Linear",
                 "labsupport.engine.quant.kernels.Int4Linear.dequantized_weight"))
BUILD_Y = ("build y from sums, scaling once per block: y = (scales * dx * sums).sum(-1) + "
           "(mins * dx * qx.sum(-1)).sum(-1). The float weights q * scale + min and the float activations "
           "qx * dx are never built: multiplying them, whole or block by block, is the float path.")


# --- W4A8: int4 weights times int8 activations, one integer sum per block --------------------------

def _w4a8_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, w) pairs: batch 1, 3 and 2, an odd number of outputs, k = 64, 96 and 1024 (32 blocks: a
    block count k // 31 gives another), activations with one large value per row (a scale per row,
    not per block, and activations left in float give other numbers), one block of zeros (dx = 0),
    and a layer whose groups sit far from zero (min ~ 1, scale ~ 2e-4) with activations whose int8
    values add up to 0 in every block: there the float path in float32 is off by ~1e-4."""
    generator = torch.Generator().manual_seed(48)
    cases = []
    for rows, n, k in ((1, 7, 64), (3, 5, 96), (2, 3, 1024)):
        x = torch.randn(rows, k, generator=generator)
        x[:, 3] = 20.0                                              # dominates the first block's scale
        cases.append((x, torch.randn(n, k, generator=generator) * 0.05))
    cases[1][0][1, 32:64] = 0.0                                     # a block of zeros: dx = 0, qx = 0
    half = torch.randn(2, 32, generator=generator)
    x = torch.stack([half, -half], dim=-1).reshape(2, 2, 32)        # pairs a, -a: sum(qx) = 0 per block
    x = x[:, :, torch.randperm(32, generator=generator)].reshape(2, 64)
    cases.append((x, 1.0 + 0.004 * torch.rand(6, 64, generator=generator)))
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
    if torch.allclose(y, blocks.reshape(x.shape[0], k) @ w_hat.T, rtol=1e-3, atol=0):
        return "that is the float path, exact only to float32's rounding of q * scale + min: " + BUILD_Y
    return ("per block: y += scale * dx * sum(q * qx) + min * dx * sum(qx), with qx = round(x / dx) in -127..127 "
            f"and dx = max|x| / 127 over the block's 32 values; expected starting {expected[0, :3].tolist()}.")


MATMULS = ("__matmul__", "__rmatmul__", "matmul", "mm", "bmm", "linear", "addmm", "einsum", "tensordot",
           "inner", "dot", "mv", "baddbmm")


def _sorted_values(t: torch.Tensor) -> torch.Tensor:
    """The distinct nonzero values of `t`, sorted, in float64, between -inf and inf (for `_near`)."""
    values = torch.unique(t.detach().double().reshape(-1))
    values = values[values != 0]
    return torch.cat([torch.tensor([-float("inf")], dtype=torch.float64), values,
                      torch.tensor([float("inf")], dtype=torch.float64)])


def _near(v: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """For each value of `v` (float64, 1-D): whether it is one of `table`'s to float rounding (1e-5)."""
    at = torch.searchsorted(table, v).clamp(1, table.numel() - 1)
    distance = torch.minimum((table[at] - v).abs(), (table[at - 1] - v).abs())
    return distance <= 1e-5 * v.abs()


class W4A8Watch(TorchFunctionMode):
    """Watches the torch calls of a learner's W4A8 answer: a call of the package's kernel
    (torch.ops.labsupport.w4a8_*), a float matmul along the full length k, and a float tensor that
    holds the dequantized weights (q * scale + min) or activations (qx * dx), whole or block by block:
    the integer method builds none of them. Notebook 04 (quantization), exercise 4."""

    def __init__(self, k: int, q, scales, mins, qx, dx):
        super().__init__()
        self.k, self.kernel, self.matmuls, self.built = k, [], [], []
        groups = q.float().reshape(q.shape[0], -1, 32)                                    # (n, blocks, 32)
        w_hat = groups * scales[..., None] + mins[..., None]
        xq = qx.float().reshape(qx.shape[0], -1, 32)                                       # (M, blocks, 32)
        x_hat = xq * dx[..., None]
        # what the tensor is, the values that mark it, and the values it may hold beside them (q = 0: the
        # minimum; |qx| = 1: dx itself, which a right answer broadcasts)
        self.marks = [("the dequantized weights, q * scale + min", _sorted_values(w_hat[groups > 0]),
                       _sorted_values(mins)),
                      ("the dequantized activations, qx * dx", _sorted_values(x_hat[xq.abs() > 1]),
                       _sorted_values(torch.cat([dx, -dx])))]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if str(func).startswith("labsupport.w4a8"):
            self.kernel.append(f"torch.ops.{func}")
        if name in MATMULS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [a for a in args if isinstance(a, (list, tuple)) for a in a if isinstance(a, torch.Tensor)]
            if any(t.is_floating_point() for t in tensors) and any(t.dim() and t.shape[-1] == self.k for t in tensors):
                self.matmuls.append(name)
        for out in (result if isinstance(result, (tuple, list)) else (result,)):
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() >= 16:
                self._look_at(out)
        return result

    def _look_at(self, t: torch.Tensor) -> None:
        v = t.detach().reshape(-1).double()
        v = v[v != 0]
        for what, marks, beside in self.marks:
            if v.numel() < 16 or what in self.built:
                continue
            marked = _near(v, marks)
            if int(marked.sum()) >= 16 and bool(_near(v[~marked], beside).all()):
                self.built.append(what)


def _check_sums(case, x, q, sums, expected_sums) -> None:
    """The integer block sums: an integer tensor, exactly the reference's."""
    if sums.is_floating_point() or sums.is_complex():
        fail(case, "sums as an integer tensor (torch.int32 or int64)", f"dtype {sums.dtype}",
             "the point of W4A8 is integer arithmetic: multiply qx (int8) by q (0..15) as integers "
             "(.to(torch.int32) first: int8 products overflow) and sum each block.")
    if tuple(sums.shape) == tuple(expected_sums.shape) and torch.equal(sums.long(), expected_sums):
        return
    wrapped = sums.shape == expected_sums.shape and torch.equal(sums.long(), ((expected_sums + 128) % 256) - 128)
    row_dx = x.abs().amax(dim=1, keepdim=True) / 127                         # (M, 1): a scale per row
    row_qx = torch.round(x / row_dx).clamp(-127, 127).long().reshape(x.shape[0], -1, 32)
    per_row = sums.shape == expected_sums.shape and torch.equal(
        sums.long(), torch.einsum("mbi,nbi->mnb", row_qx, q.reshape(q.shape[0], -1, 32).long()))
    hint = ("the sums wrapped around: int8 (or uint8) products overflow; convert to torch.int32 before "
            "multiplying." if wrapped else
            "one activation scale per row: take dx per block of 32 values (x.reshape(M, k // 32, 32)), "
            "as the weights have theirs, so that one large value only coarsens its own block." if per_row else
            "qx = round(x / dx) clamped to -127..127, dx = max|x| / 127 per block of 32 (per row and "
            "block), and sums[m, j, b] = sum over the block's 32 positions of q[j] * qx[m]: shape (M, n, k / 32).")
    fail(case, f"sums of shape {tuple(expected_sums.shape)} starting {expected_sums.flatten()[:3].tolist()}",
         f"shape {tuple(sums.shape)} starting {sums.flatten()[:3].tolist()}", hint)


def _check_method(case, k: int, watch: W4A8Watch) -> None:
    """y from the integer sums: no float weights or activations built, no float matmul along k."""
    if watch.built:
        fail(case, "y computed from the integer block sums", f"a float tensor of {watch.built[0]}", BUILD_Y)
    if watch.matmuls:
        fail(case, "y computed from the integer block sums", f"a float {watch.matmuls[0]} along k = {k}", BUILD_Y)


def _one_case(matmul_fn, number: int, x: torch.Tensor, w: torch.Tensor) -> None:
    """One layer: the learner's (y, sums) under the watch, then the sums, the method and y."""
    case = f"{EXERCISE} (case {number}: x {tuple(x.shape)}, weight {tuple(w.shape)})"
    q, scales, mins = quantize_int4_groupwise(w, 32)
    scales, mins = scales.half().float(), mins.half().float()             # as the kernel stores them
    qx, dx = quantize_activations(x)
    with W4A8Watch(x.shape[1], q, scales, mins, qx, dx) as watch:
        answer = _call(matmul_fn, (x.clone(), q.clone(), scales.clone(), mins.clone()), case, "(y, sums)",
                       "cut x and q into blocks of 32 along k: x.reshape(M, k // 32, 32), q.reshape(n, k // 32, 32).")
    if watch.kernel:
        raise refusal(W4A8, watch.kernel[0])
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        fail(case, "a pair (y, sums)", type(answer).__name__, "end with `return y, sums`")
    y, sums = (_as_tensor(t, name, case) for t, name in zip(answer, ("y", "sums")))
    expected_sums = torch.einsum("mbi,nbi->mnb", qx.reshape(x.shape[0], -1, 32).long(),
                                 q.reshape(w.shape[0], -1, 32).long())     # (M, n, blocks)
    _check_sums(case, x, q, sums, expected_sums)
    _check_method(case, x.shape[1], watch)
    expected = w4a8_reference(x, *pack_q4_1(q, scales, mins))                 # (M, n)
    y = y.float()
    close = y.shape == expected.shape and torch.allclose(y, expected, rtol=1e-5,
                                                         atol=1e-5 * float(expected.abs().max()))
    if not close:
        hint = (_w4a8_hint(x, q, scales, mins, y, expected) if y.shape == expected.shape else
                "y is (M, n): one output per row of x and per output feature.")
        fail(case, f"y of shape {tuple(expected.shape)} starting {expected[0, :3].tolist()}",
             f"shape {tuple(y.shape)} starting {y.flatten()[:3].tolist()}", hint)


@grades_quietly
@graded(W4A8)
def check_w4a8_matmul(matmul_fn) -> None:
    """Check a learner's `matmul_fn(x, q, scales, mins) -> (y, sums)`: x float (M, k), q uint8 (n, k)
    in 0..15 with scales and mins (n, k / 32) (int4 in groups of 32, w = q * scale + min); sums the
    integer block sums (M, n, k / 32), sum over each block of q * qx with x quantized to int8 per
    block of 32 (dx = max|x| / 127, qx = round(x / dx)); y (M, n) = sum over blocks of
    scale * dx * sums + min * dx * sum(qx).

    Introduced in notebook 04 (quantization). The sums must be integers and exactly the
    reference's (`w4a8.quantize_activations`); y must match the float64 reference of the same
    arithmetic (`lab.quantization_error.w4a8_reference`) to float32 rounding. The method is graded:
    an answer that builds the dequantized weights or activations as float tensors, or makes a float
    matmul along k (`W4A8Watch`), is refused, and so is a call of the package's W4A8 code
    (`W4A8.computed_by`, the kernel's torch.ops.labsupport.w4a8_linear).
    """
    cases = _w4a8_cases()
    for number, (x, w) in enumerate(cases, 1):
        _one_case(matmul_fn, number, x, w)
    passed(EXERCISE, f"Checked on {len(cases)} layers, batches of 1 to 3 rows: integer block sums exact, outputs "
                     f"to float rounding.")
