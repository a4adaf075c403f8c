"""Checker cases of notebook 04 (quantization): the reference and each typical mistake."""

import torch
import torch.nn.functional as F

from labsupport.checks.quantize import check_int4_groupwise, check_int4_pack, check_int8_absmax
from labsupport.checks.quantize_w4a8 import check_w4a8_matmul
from labsupport.engine.quant import (dequantize_int4, dequantize_int8, pack_int4, quantize_int4_groupwise,
                                     quantize_int8_absmax, unpack_int4)

from checker_cases.common import accepts, refuses


# --- notebook 04 (quantization): int8 absmax -------------------------------------------------

def per_tensor(w):
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def per_column(w):
    scale = w.abs().amax(dim=0) / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def scale_over_128(w):
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def scale_over_128_without_clamp(w):          # 128 wraps around to -128 in int8
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).to(torch.int8), scale


def scale_over_255(w):
    scale = w.abs().amax(dim=1) / 255
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def no_round(w):
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]), scale


def truncated(w):                             # .to(torch.int8) cuts the fraction off
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]).to(torch.int8), scale


def without_clamp(w):                         # harmless with 127: |w| / scale never passes 127
    scale = w.abs().amax(dim=1) / 127
    return torch.round(w / scale[:, None]).to(torch.int8), scale


# --- int4 packing ---------------------------------------------------------------------------------

def _even(q):
    return torch.cat([q, q.new_zeros(q.shape[0], q.shape[1] % 2)], dim=1).to(torch.uint8)


def swapped_nibbles(q):
    q = _even(q)
    return q[:, 1::2] | (q[:, 0::2] << 4)


def signed_offset(q):                         # treats q as signed int4: stores q - 8
    q = _even(q).to(torch.int16) - 8
    return ((q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)).to(torch.uint8)


def no_padding(q):                            # an odd width cannot pair its last column
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def interleave(packed):
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


# --- int4 in groups ------------------------------------------------------------------------------------

def dequantized(q, scales, zeros):
    """dequantize_int4 by hand (the checker refuses a call of it): each group q * scale + zero."""
    out_features, in_features = q.shape
    groups = q.float().reshape(out_features, scales.shape[1], -1)
    return (groups * scales[..., None] + zeros[..., None]).reshape(out_features, in_features)


def reference_linear(x, q, scales, zeros):
    return F.linear(x, dequantized(q, scales, zeros))


def reference_int4(w, group_size):                  # the notebook's solution
    return int4_with(w, group_size)


def int4_with(w, group_size, steps=15, strided=False, symmetric=False, rounding=torch.round):
    out_features, in_features = w.shape
    shape = (out_features, group_size, in_features // group_size) if strided else \
        (out_features, in_features // group_size, group_size)
    groups = w.reshape(shape)
    axis = 1 if strided else -1
    if symmetric:
        scales = groups.abs().amax(axis) / 7
        q = rounding(groups / scales.unsqueeze(axis)).clamp(-8, 7) + 8
        return q.to(torch.uint8).reshape(out_features, in_features), scales, torch.zeros_like(scales)
    low, high = groups.amin(axis), groups.amax(axis)
    scales = ((high - low) / steps).clamp(min=1e-12)
    q = rounding((groups - low.unsqueeze(axis)) / scales.unsqueeze(axis)).clamp(0, 15)
    return q.to(torch.uint8).reshape(out_features, in_features), scales, low


def per_row_int4(w, group_size):
    low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    scales = (high - low) / 15
    return torch.round((w - low) / scales).clamp(0, 15).to(torch.uint8), scales, low


def repeated_not_interleaved(x, q, scales, zeros):
    group = q.shape[1] // scales.shape[1]
    return x @ (q.float() * scales.repeat(1, group) + zeros.repeat(1, group)).T


def without_zero(x, q, scales, zeros):
    return F.linear(x, dequantized(q, scales, torch.zeros_like(zeros)))


def not_transposed(x, q, scales, zeros):
    return x @ dequantized(q, scales, zeros)



def w4a8_matmul(x, q, scales, mins, per_row=False, no_min=False, float_sums=False, int8=False,
                dequantized=False):
    """Exercise 4's answer, and (by a switch) each usual slip."""
    M, k = x.shape
    n, blocks = q.shape[0], k // 32
    xb = x.float().reshape(M, blocks, 32)                                   # (M, blocks, 32)
    dx = xb.abs().amax(dim=-1) / 127                                        # (M, blocks)
    if per_row:
        dx = (x.abs().amax(dim=1, keepdim=True) / 127).expand(M, blocks)
    kind = torch.int8 if int8 else torch.int32
    qx = torch.round(xb / torch.where(dx > 0, dx, 1.0)[..., None]).clamp(-127, 127).to(kind)
    qb = q.reshape(n, blocks, 32).to(kind)                                  # (n, blocks, 32)
    sums = (qx[:, None] * qb[None]).sum(-1, dtype=kind)                     # (M, n, blocks)
    y = (scales[None] * dx[:, None] * sums).sum(-1)
    if not no_min:
        y = y + (mins[None] * dx[:, None] * qx.sum(-1)[:, None]).sum(-1)
    if dequantized:                                  # the right y by a float matmul: no integer sums
        w_hat = (q.float().reshape(n, blocks, 32) * scales[..., None] + mins[..., None]).reshape(n, k)
        return (qx.float() * dx[..., None]).reshape(M, k) @ w_hat.T, sums.float()
    return y, sums.float() if float_sums else sums


NOTEBOOK_04 = [
    accepts(check_int8_absmax, "reference", quantize_int8_absmax, dequantize_int8),
    accepts(check_int8_absmax, "without-clamp", without_clamp, dequantize_int8),
    refuses(check_int8_absmax, "per-tensor-scale", "per row", per_tensor, dequantize_int8),
    refuses(check_int8_absmax, "per-column-scale", "per column", per_column, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-128", "127", scale_over_128, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-128-without-clamp", "wraps around", scale_over_128_without_clamp,
            dequantize_int8),
    refuses(check_int8_absmax, "scale-over-255", "signed", scale_over_255, dequantize_int8),
    refuses(check_int8_absmax, "no-rounding", "round", no_round, dequantize_int8),
    refuses(check_int8_absmax, "truncated-not-rounded", "cuts the fraction off", truncated, dequantize_int8),
    refuses(check_int8_absmax, "one-scale-to-dequantize", "round trip",
            quantize_int8_absmax, lambda q, scale: q.float() * scale.mean()),
    refuses(check_int8_absmax, "divided-by-the-scale", "do not divide",
            quantize_int8_absmax, lambda q, scale: q.float() / scale[:, None]),
    refuses(check_int8_absmax, "scale-without-a-column-axis", r"scale\[:, None\]",
            quantize_int8_absmax, lambda q, scale: q.float() * scale),
    accepts(check_int4_pack, "reference", pack_int4, unpack_int4),
    refuses(check_int4_pack, "swapped-nibbles", "swapped", swapped_nibbles, unpack_int4),
    refuses(check_int4_pack, "int32-bytes", "uint8", lambda q: pack_int4(q).to(torch.int32), unpack_int4),
    refuses(check_int4_pack, "signed-offset-when-packing", "offset of 8", signed_offset, unpack_int4),
    refuses(check_int4_pack, "odd-width-not-padded", "pair it with a zero", no_padding, unpack_int4),
    refuses(check_int4_pack, "odd-width-padding-kept", "padding nibble", pack_int4,
            lambda packed, columns: interleave(packed)),
    refuses(check_int4_pack, "signed-offset-when-unpacking", "offset of 8", pack_int4,
            lambda packed, columns: interleave(packed)[:, :columns].to(torch.int16) - 8),
    refuses(check_int4_pack, "halves-not-interleaved", "interleave",
            pack_int4, lambda packed, columns: torch.cat([packed & 0x0F, packed >> 4], dim=1)[:, :columns]),
    refuses(check_int4_pack, "unpacked-high-first", "low and high are swapped", pack_int4,
            lambda packed, columns: torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(packed.shape[0], -1)[:, :columns]),
    refuses(check_int4_pack, "unpacked-without-reshape", "wrong shape",
            pack_int4, lambda packed, columns: torch.stack([packed & 0x0F, packed >> 4], dim=-1)),
    accepts(check_int4_groupwise, "reference", reference_int4, reference_linear),
    refuses(check_int4_groupwise, "the-packages-own-quantizer", "write the steps yourself",
            quantize_int4_groupwise, reference_linear),
    refuses(check_int4_groupwise, "the-packages-own-dequantizer", "write the steps yourself",
            reference_int4, lambda x, q, scales, zeros: F.linear(x, dequantize_int4(q, scales, zeros))),
    refuses(check_int4_groupwise, "sixteen-steps", "15", lambda w, g: int4_with(w, g, steps=16), reference_linear),
    refuses(check_int4_groupwise, "one-group-per-row", "one scale per row", per_row_int4, reference_linear),
    refuses(check_int4_groupwise, "strided-groups", "consecutive", lambda w, g: int4_with(w, g, strided=True),
            reference_linear),
    refuses(check_int4_groupwise, "symmetric", "symmetric", lambda w, g: int4_with(w, g, symmetric=True),
            reference_linear),
    refuses(check_int4_groupwise, "truncated-not-rounded", "cuts the fraction off",
            lambda w, g: int4_with(w, g, rounding=torch.trunc), reference_linear),
    refuses(check_int4_groupwise, "float-q", "uint8", lambda w, g: tuple(
        t.float() if i == 0 else t for i, t in enumerate(reference_int4(w, g)))[:3], reference_linear),
    refuses(check_int4_groupwise, "scales-repeated-not-interleaved", "repeat_interleave",
            reference_int4, repeated_not_interleaved),
    refuses(check_int4_groupwise, "zero-forgotten", "add the zero back", reference_int4, without_zero),
    refuses(check_int4_groupwise, "weight-not-transposed", r"w\.T", reference_int4, not_transposed),
    accepts(check_w4a8_matmul, "reference", w4a8_matmul),
    refuses(check_w4a8_matmul, "activation-scale-per-row", "one activation scale per row",
            lambda *a: w4a8_matmul(*a, per_row=True)),
    refuses(check_w4a8_matmul, "minimum-term-forgotten", "minimum's term is missing",
            lambda *a: w4a8_matmul(*a, no_min=True)),
    refuses(check_w4a8_matmul, "int8-products-overflow", "wrapped around", lambda *a: w4a8_matmul(*a, int8=True)),
    refuses(check_w4a8_matmul, "float-sums", "integer arithmetic", lambda *a: w4a8_matmul(*a, float_sums=True)),
    refuses(check_w4a8_matmul, "float-matmul-of-dequantized", "integer arithmetic",
            lambda *a: w4a8_matmul(*a, dequantized=True)),
    refuses(check_w4a8_matmul, "activations-not-quantized", "integer arithmetic",
            lambda x, q, s, m: (x @ (q.float().reshape(q.shape[0], -1, 32) * s[..., None] + m[..., None])
                                .reshape(q.shape).T, torch.zeros(x.shape[0], q.shape[0], x.shape[1] // 32))),
]
