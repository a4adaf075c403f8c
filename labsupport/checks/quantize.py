"""Checkers for notebook 04 (quantization): int8 absmax and int4 packing.

Introduced in notebook 04 (quantization). Each checker compares a learner's
functions with the package's reference (`labsupport.quantize`) and prints a
short confirmation or raises `CheckFailed` with what was expected, what came
back, and a hint.
"""

from __future__ import annotations

import torch

from ..quantize import dequantize_int8, pack_int4, quantize_int8_absmax, unpack_int4
from . import fail, passed


def _int8_cases() -> list[torch.Tensor]:
    """Weight-like matrices: random, one with an outlier row, one with rows of very different sizes."""
    generator = torch.Generator().manual_seed(4)
    cases = [torch.randn(8, 32, generator=generator) * 0.05,
             torch.randn(16, 64, generator=generator)]
    spread = torch.randn(6, 48, generator=generator) * torch.logspace(-3, 1, 6)[:, None]   # rows 0.001 .. 10
    outlier = torch.randn(4, 40, generator=generator) * 0.02
    outlier[2, 7] = 3.0
    return cases + [spread, outlier]


def _as_tensor(value, what: str, exercise: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        fail(exercise, f"{what} as a torch tensor", type(value).__name__,
             "return torch tensors, e.g. `return q, scale`")
    return value


def _int8_hint(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> str:
    """Guess the usual slip behind a wrong int8 quantization."""
    row_max = w.abs().amax(dim=1)
    if scale.numel() == 1 and w.shape[0] > 1:
        return ("one scale for the whole tensor (per-tensor): take max|w| per row, "
                "w.abs().amax(dim=1), so that each output channel gets its own scale.")
    if scale.numel() == w.shape[0]:
        s = scale.float().reshape(-1)
        if torch.allclose(s, row_max / 128, rtol=1e-4):
            return "int8 absmax divides by 127 (the symmetric range -127..127), not 128."
        if torch.allclose(s, row_max / 255, rtol=1e-4) or torch.allclose(s, row_max / 256, rtol=1e-4):
            return "int8 is signed: scale = max|w| / 127, not / 255."
        if torch.allclose(s, row_max, rtol=1e-4):
            return "scale = max|w| / 127: divide the row's largest magnitude by 127."
        if torch.allclose(s, 127 / row_max, rtol=1e-4):
            return "the scale is upside down: scale = max|w| / 127, and q = round(w / scale)."
    if q.is_floating_point() and not torch.equal(q, torch.round(q)):
        return "round w / scale to the nearest integer (torch.round) before storing it as int8."
    if q.dtype != torch.int8:
        return "store q as int8: .to(torch.int8) after rounding and clamping to -127..127."
    return ("scale = w.abs().amax(dim=1) / 127 (one per row), q = round(w / scale[:, None]) "
            "clamped to -127..127 as int8; dequantize: q.float() * scale[:, None].")


def check_int8_absmax(quantize_fn, dequantize_fn) -> None:
    """Check a learner's `quantize_fn(w) -> (q, scale)` and `dequantize_fn(q, scale) -> w_approx`:
    symmetric absmax int8 with one scale per row (output channel).

    Introduced in notebook 04 (quantization). Compared with `quantize_int8_absmax` and
    `dequantize_int8` on random weight-like matrices; the round trip must stay within
    scale / 2 of the original (that is what rounding to the nearest step allows).
    """
    exercise = "int8 absmax quantization"
    cases = _int8_cases()
    worst = 0.0
    for number, w in enumerate(cases, 1):
        case = f"{exercise} (case {number}: a {tuple(w.shape)} matrix)"
        answer = quantize_fn(w.clone())
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            fail(case, "a pair (q, scale)", type(answer).__name__, "end with `return q, scale`")
        q, scale = (_as_tensor(answer[0], "q", case), _as_tensor(answer[1], "scale", case))
        ref_q, ref_scale = quantize_int8_absmax(w)
        if q.shape != w.shape:
            fail(case, f"q of shape {tuple(w.shape)}", f"shape {tuple(q.shape)}",
                 "q has one integer per weight, the same shape as w.")
        if scale.numel() != ref_scale.numel() or not torch.allclose(scale.float().reshape(-1), ref_scale,
                                                                   rtol=1e-4, atol=1e-12):
            shown = scale.float().reshape(-1)[:3].tolist()
            fail(case, f"scales starting {[round(v, 6) for v in ref_scale[:3].tolist()]} (one per row)",
                 f"{scale.numel()} scale(s) starting {[round(v, 6) for v in shown]}", _int8_hint(w, q, scale))
        if q.dtype != torch.int8 or int(q.float().abs().max()) > 127:
            fail(case, "q as int8 values in -127..127", f"dtype {q.dtype}, largest |q| {q.float().abs().max():.0f}",
                 _int8_hint(w, q, scale))
        mismatched = (q.to(torch.int16) != ref_q.to(torch.int16)).float().mean().item()
        if mismatched > 0.01:                   # a value exactly at .5 may round either way
            fail(case, "q equal to the reference's rounding", f"{mismatched:.0%} of the values differ",
                 _int8_hint(w, q, scale))
        approx = dequantize_fn(q, scale)
        approx = _as_tensor(approx, "the dequantized weight", case)
        if approx.shape != w.shape:
            fail(case, f"a dequantized weight of shape {tuple(w.shape)}", f"shape {tuple(approx.shape)}",
                 "multiply each row by its scale: q.float() * scale[:, None].")
        error = (approx.float() - w).abs()
        bound = ref_scale[:, None] / 2 + 1e-6
        if not torch.allclose(approx.float(), dequantize_int8(ref_q, ref_scale), rtol=1e-4, atol=1e-6) \
                or (error > bound * 1.001).any():
            fail(case, "w within scale / 2 of the original after the round trip",
                 f"a largest error of {error.max():.3g} (its row's scale / 2 is {bound.max():.3g})",
                 "dequantize with q.float() * scale[:, None] (the scale of each row, broadcast over columns).")
        worst = max(worst, (error / bound).max().item())
    passed(exercise, f"Checked on {len(cases)} matrices; the worst error was {worst:.0%} of its row's scale / 2.")


def _pack_cases() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8),
            torch.arange(16, dtype=torch.uint8).reshape(2, 8),
            torch.randint(0, 16, (5, 32), generator=generator, dtype=torch.uint8)]


def check_int4_pack(pack_fn, unpack_fn) -> None:
    """Check a learner's `pack_fn(q) -> packed` and `unpack_fn(packed) -> q`: two 4-bit
    values (0..15) per byte, column 2j in the low nibble and column 2j + 1 in the high one.

    Introduced in notebook 04 (quantization). Compared with `pack_int4` / `unpack_int4`,
    and the round trip must give back the values exactly.
    """
    exercise = "int4 packing"
    cases = _pack_cases()
    for number, q in enumerate(cases, 1):
        case = f"{exercise} (case {number}: values {q[0, :4].tolist()}... of shape {tuple(q.shape)})"
        expected = pack_int4(q)
        packed = _as_tensor(pack_fn(q.clone()), "the packed bytes", case)
        if packed.shape != expected.shape:
            fail(case, f"packed shape {tuple(expected.shape)} (half the columns)", f"shape {tuple(packed.shape)}",
                 "two values share one byte: take the even columns q[:, 0::2] and the odd ones q[:, 1::2].")
        if not torch.equal(packed.to(torch.int32), expected.to(torch.int32)):
            swapped = (q[:, 1::2].to(torch.int32) | (q[:, 0::2].to(torch.int32) << 4))
            if torch.equal(packed.to(torch.int32), swapped):
                hint = "the nibbles are swapped: column 2j goes in the low 4 bits, column 2j + 1 in the high 4 bits."
            elif packed.to(torch.int32).max() > 255 or packed.dtype not in (torch.uint8,):
                hint = "store the bytes as torch.uint8 (values 0..255); convert q with .to(torch.uint8) first."
            else:
                hint = "packed = low | (high << 4), with low = q[:, 0::2] and high = q[:, 1::2]."
            fail(case, f"bytes starting {expected[0, :2].tolist()}", f"{packed.reshape(-1)[:2].tolist()}", hint)
        if packed.dtype != torch.uint8:
            fail(case, "packed bytes as torch.uint8", f"dtype {packed.dtype}",
                 "convert with .to(torch.uint8): one byte holds two 4-bit values.")
        unpacked = _as_tensor(unpack_fn(expected.clone()), "the unpacked values", case)
        if unpacked.shape != q.shape or not torch.equal(unpacked.to(torch.int32), q.to(torch.int32)):
            got = unpacked.reshape(-1)[:4].tolist()
            if unpacked.numel() == q.numel() and torch.equal(unpacked.reshape(q.shape).to(torch.int32),
                                                              unpack_int4(expected).reshape(q.shape).to(torch.int32)):
                hint = "right values, wrong shape: interleave with torch.stack([low, high], dim=-1).reshape(rows, -1)."
            elif unpacked.numel() == q.numel() and torch.equal(
                    torch.stack([expected >> 4, expected & 0x0F], dim=-1).reshape(q.shape).to(torch.int32),
                    unpacked.reshape(q.shape).to(torch.int32)):
                hint = "low and high are swapped: the low nibble (packed & 0x0F) is column 2j, the high one (packed >> 4) 2j + 1."
            else:
                hint = ("low = packed & 0x0F, high = packed >> 4, then interleave them: "
                        "torch.stack([low, high], dim=-1).reshape(rows, -1).")
            fail(case, f"the values {q.reshape(-1)[:4].tolist()}... of shape {tuple(q.shape)}",
                 f"{got}... of shape {tuple(unpacked.shape)}", hint)
    passed(exercise, f"Round trip exact on {len(cases)} matrices, in the package's nibble order "
                     "(low nibble first); half the bytes of int8.")
