"""Checkers for notebook 04 (quantization): int8 absmax and int4 packing (exercises 1 and 2).

Introduced in notebook 04 (quantization). Each checker compares a learner's
functions with the package's reference (`labsupport.engine.quant`) on inputs chosen
so that each usual slip gives another answer, and prints a short confirmation or
raises `CheckFailed` with what was expected, what came back, and a hint that
names the slip. Exercise 3 (AWQ's scale search) is checked in `quantization_awq`, exercise 4
(the W4A8 block dot product) in `quantization_w4a8`.
"""

from __future__ import annotations

import torch

from ..engine.quant import dequantize_int8, pack_int4, quantize_int8_absmax, unpack_int4
from ..errors import first_line
from . import fail, grades_quietly, passed
from .grading import Exercise, graded

ENGINE_QUANT = "labsupport.engine.quant"
INT8 = Exercise(
    title="int8 absmax quantization",
    teaches="symmetric int8 quantization with one absmax scale per row (scale = max|w| / 127, "
            "q = round(w / scale)) and its dequantization, q * scale",
    computed_by=(f"{ENGINE_QUANT}.formats.quantize_int8_absmax", f"{ENGINE_QUANT}.formats.dequantize_int8",
                 f"{ENGINE_QUANT}.kernels.Int8Linear", f"{ENGINE_QUANT}.kernels.Int8Linear.from_linear",
                 f"{ENGINE_QUANT}.kernels.Int8Linear.dequantized_weight", f"{ENGINE_QUANT}.quantize_linear",
                 f"{ENGINE_QUANT}.quantized_replacement", f"{ENGINE_QUANT}.quantize_model",
                 "labsupport.engine.drafts.quantized_copy", "labsupport.engine.kv_quant.quantize_per_token",
                 "labsupport.engine.kv_quant.dequantize_per_token", "labsupport.engine.kv_quant.Int8KVCache"))
INT4_PACK = Exercise(
    title="int4 packing",
    teaches="the packing of two 4-bit values into one byte (column 2j in the low nibble, 2j + 1 in the "
            "high one) and its unpacking",
    computed_by=(f"{ENGINE_QUANT}.formats.pack_int4", f"{ENGINE_QUANT}.formats.unpack_int4",
                 f"{ENGINE_QUANT}.w4a8.pack_q4_1", f"{ENGINE_QUANT}.w4a8.unpack_q4_1",
                 f"{ENGINE_QUANT}.kernels.Int4Linear", f"{ENGINE_QUANT}.kernels.Int4Linear.dequantized_weight"))


def _as_tensor(value, what: str, exercise: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        fail(exercise, f"{what} as a torch tensor", type(value).__name__,
             "return torch tensors, e.g. `return q, scale`")
    return value


def _call(fn, args: tuple, case: str, expected: str, hint: str):
    """fn(*args), or CheckFailed with the error's first line and `hint` (a shape slip raises)."""
    try:
        return fn(*args)
    except (RuntimeError, IndexError, ValueError) as error:
        fail(case, expected, f"an error ({first_line(error, limit=90)})", hint)


# --- int8 absmax ---------------------------------------------------------------------------------

def _int8_cases() -> list[torch.Tensor]:
    """Weight-like matrices, none square (a scale per column then has another length): random,
    rows of very different sizes, and one outlier that a per-tensor scale would serve for all."""
    generator = torch.Generator().manual_seed(4)
    cases = [torch.randn(8, 32, generator=generator) * 0.05,
             torch.randn(16, 64, generator=generator)]
    spread = torch.randn(6, 48, generator=generator) * torch.logspace(-3, 1, 6)[:, None]   # rows 0.001 .. 10
    outlier = torch.randn(4, 40, generator=generator) * 0.02
    outlier[2, 7] = 3.0
    return cases + [spread, outlier]


def _int8_hint(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> str:
    """The usual slip behind a wrong int8 quantization."""
    row_max = w.abs().amax(dim=1)
    if not q.is_floating_point() and ((q.to(torch.int16) == -128) & (w > 0)).any():
        return ("a positive weight became -128: 128 does not fit in int8 and wraps around. Divide by 127 "
                "and clamp to -127..127 before .to(torch.int8).")
    if scale.numel() == 1 and w.shape[0] > 1:
        return ("one scale for the whole tensor (per-tensor): take max|w| per row, "
                "w.abs().amax(dim=1), so that each output channel gets its own scale.")
    if scale.numel() == w.shape[1] != w.shape[0]:
        return "one scale per column: take max|w| along each row, amax(dim=1), one scale per output channel."
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
    if scale.numel() == w.shape[0]:
        ratio = w / scale.float().reshape(-1, 1)
        if torch.equal(q.to(torch.int32), ratio.trunc().to(torch.int32)):
            return ".to(torch.int8) cuts the fraction off (toward zero): torch.round(w / scale) first."
    if q.dtype != torch.int8:
        return "store q as int8: .to(torch.int8) after rounding and clamping to -127..127."
    return ("scale = w.abs().amax(dim=1) / 127 (one per row), q = round(w / scale[:, None]) "
            "clamped to -127..127 as int8; dequantize: q.float() * scale[:, None].")


@grades_quietly
@graded(INT8)
def check_int8_absmax(quantize_fn, dequantize_fn) -> None:
    """Check a learner's `quantize_fn(w) -> (q, scale)` and `dequantize_fn(q, scale) -> w_approx`:
    symmetric absmax int8 with one scale per row (output channel).

    Introduced in notebook 04 (quantization). Compared with `quantize_int8_absmax` and
    `dequantize_int8` on weight-like matrices (none square, one with an outlier, one with
    rows of very different sizes); the round trip must stay within scale / 2 of the original.
    A call of the package's int8 code (`INT8.computed_by`) is refused.
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
        approx = _call(dequantize_fn, (q, scale), case, "the dequantized weight",
                       "q is (out, in) and scale (out,): give scale a column axis, q.float() * scale[:, None].")
        approx = _as_tensor(approx, "the dequantized weight", case)
        if approx.shape != w.shape:
            fail(case, f"a dequantized weight of shape {tuple(w.shape)}", f"shape {tuple(approx.shape)}",
                 "multiply each row by its scale: q.float() * scale[:, None].")
        error = (approx.float() - w).abs()
        bound = ref_scale[:, None] / 2 + 1e-6
        if not torch.allclose(approx.float(), dequantize_int8(ref_q, ref_scale), rtol=1e-4, atol=1e-6) \
                or (error > bound * 1.001).any():
            divided = torch.allclose(approx.float(), q.float() / scale.float().reshape(-1, 1), rtol=1e-4)
            fail(case, "w within scale / 2 of the original after the round trip",
                 f"a largest error of {error.max():.3g} (its row's scale / 2 is {bound.max():.3g})",
                 "multiply by the scale, do not divide: w = q * scale." if divided else
                 "dequantize with q.float() * scale[:, None] (the scale of each row, broadcast over columns).")
        worst = max(worst, (error / bound).max().item())
    passed(exercise, f"Checked on {len(cases)} matrices; the worst error was {worst:.0%} of its row's scale / 2.")


# --- int4 packing --------------------------------------------------------------------------------

def _pack_cases() -> list[torch.Tensor]:
    """Values 0..15, small enough to read in a message; the odd ones need a zero to pair with."""
    generator = torch.Generator().manual_seed(5)
    return [torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8),
            torch.arange(16, dtype=torch.uint8).reshape(2, 8),
            torch.tensor([[3, 12, 9]], dtype=torch.uint8),                                   # odd: 3 columns
            torch.randint(0, 16, (5, 32), generator=generator, dtype=torch.uint8),
            torch.randint(0, 16, (4, 7), generator=generator, dtype=torch.uint8)]


def _pack_hint(q: torch.Tensor, packed: torch.Tensor) -> str:
    """The usual slip behind wrong packed bytes."""
    even = torch.cat([q, q.new_zeros(q.shape[0], q.shape[1] % 2)], dim=1).to(torch.int32)    # (rows, even)
    got = packed.to(torch.int32)
    expected = pack_int4(q).to(torch.int32)
    if q.shape[1] % 2 and got.shape == expected.shape and torch.equal(got[:, :-1], expected[:, :-1]) \
            and torch.equal(got[:, -1] & 0x0F, expected[:, -1] & 0x0F):
        return ("the last byte of an odd row pairs its last value with another one: pair it with a zero "
                "(pad q with one zero column first).")
    if torch.equal(got, even[:, 1::2] | (even[:, 0::2] << 4)):
        return "the nibbles are swapped: column 2j goes in the low 4 bits, column 2j + 1 in the high 4 bits."
    if torch.equal(got, pack_int4(q ^ 8).to(torch.int32)):
        return ("q is unsigned (0..15) here: store it as it is. An offset of 8 belongs to signed int4 (-8..7), "
                "as in the kernels' (q - 8) * scale.")
    if got.max() > 255 or packed.dtype != torch.uint8:
        return "store the bytes as torch.uint8 (values 0..255); convert q with .to(torch.uint8) first."
    return "packed = low | (high << 4), with low = q[:, 0::2] and high = q[:, 1::2]."


def _unpack_hint(q: torch.Tensor, expected: torch.Tensor, unpacked: torch.Tensor) -> str:
    """The usual slip behind wrong unpacked values."""
    got = unpacked.to(torch.int32)
    full = unpack_int4(expected).to(torch.int32)                                             # every nibble
    if got.shape == full.shape != q.shape and torch.equal(got, full):
        return "the padding nibble came back: return only the first `columns` values of each row."
    if got.numel() == q.numel():
        flat = got.reshape(q.shape)
        if torch.equal(flat, q.to(torch.int32)):
            return "right values, wrong shape: interleave with torch.stack([low, high], dim=-1).reshape(rows, -1)."
        if torch.equal(flat, q.to(torch.int32) - 8) or torch.equal(flat, (q.to(torch.int32) - 8) % 256):
            return "q is unsigned (0..15): return the nibbles as they are, with no offset of 8."
        swapped = torch.stack([expected >> 4, expected & 0x0F], dim=-1).reshape(q.shape[0], -1)[:, :q.shape[1]]
        if torch.equal(flat, swapped.to(torch.int32)):
            return ("low and high are swapped: the low nibble (packed & 0x0F) is column 2j, "
                    "the high one (packed >> 4) 2j + 1.")
    return ("low = packed & 0x0F, high = packed >> 4, interleave them: "
            "torch.stack([low, high], dim=-1).reshape(rows, -1), then keep the first `columns`.")


@grades_quietly
@graded(INT4_PACK)
def check_int4_pack(pack_fn, unpack_fn) -> None:
    """Check a learner's `pack_fn(q) -> packed` and `unpack_fn(packed, columns) -> q`: two 4-bit
    values (0..15) per byte, column 2j in the low nibble and column 2j + 1 in the high one; an
    odd last column paired with a zero high nibble, dropped again by `unpack_fn`.

    Introduced in notebook 04 (quantization). Compared with `pack_int4` / `unpack_int4` on
    even and odd widths; the round trip must give back the values exactly. A call of the
    package's nibble packing (`INT4_PACK.computed_by`) is refused.
    """
    exercise = "int4 packing"
    cases = _pack_cases()
    for number, q in enumerate(cases, 1):
        case = f"{exercise} (case {number}: values {q[0, :4].tolist()}... of shape {tuple(q.shape)})"
        expected = pack_int4(q)
        odd = "; an odd last column is paired with a zero (pad q with one zero column first)" if q.shape[1] % 2 else ""
        packed = _call(pack_fn, (q.clone(),), case, f"packed bytes of shape {tuple(expected.shape)}",
                       "q[:, 0::2] and q[:, 1::2] must have the same width" + odd + ".")
        packed = _as_tensor(packed, "the packed bytes", case)
        if packed.shape != expected.shape:
            fail(case, f"packed shape {tuple(expected.shape)} (half the columns, rounded up)",
                 f"shape {tuple(packed.shape)}",
                 "two values share one byte: take the even columns q[:, 0::2] and the odd ones q[:, 1::2]" + odd + ".")
        if not torch.equal(packed.to(torch.int32), expected.to(torch.int32)):
            fail(case, f"bytes starting {expected[0, :2].tolist()}", f"{packed.reshape(-1)[:2].tolist()}",
                 _pack_hint(q, packed))
        if packed.dtype != torch.uint8:
            fail(case, "packed bytes as torch.uint8", f"dtype {packed.dtype}",
                 "convert with .to(torch.uint8): one byte holds two 4-bit values.")
        unpacked = _call(unpack_fn, (expected.clone(), q.shape[1]), case, f"values of shape {tuple(q.shape)}",
                         "unpack(packed, columns): interleave low and high nibbles, then keep `columns` of them.")
        unpacked = _as_tensor(unpacked, "the unpacked values", case)
        if unpacked.shape != q.shape or not torch.equal(unpacked.to(torch.int32), q.to(torch.int32)):
            fail(case, f"the values {q.reshape(-1)[:4].tolist()}... of shape {tuple(q.shape)}",
                 f"{unpacked.reshape(-1)[:4].tolist()}... of shape {tuple(unpacked.shape)}",
                 _unpack_hint(q, expected, unpacked))
    passed(exercise, f"Round trip exact on {len(cases)} matrices, odd widths included, in the package's nibble "
                     "order (low nibble first); half the bytes of int8.")
