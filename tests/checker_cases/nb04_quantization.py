"""Checker cases of notebook 04 (quantization): the reference and each typical mistake."""

import torch

from labsupport.checks.quantization import check_int4_pack, check_int8_absmax
from labsupport.checks.quantization_awq import check_awq_search
from labsupport.checks.quantization_w4a8 import check_w4a8_matmul
from labsupport.engine.quant import (dequantize_int4, dequantize_int8, pack_int4, quantize_int4_groupwise,
                                     quantize_int8_absmax, unpack_int4)
from labsupport.lab.quantization_awq import awq_search, awq_weight

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


# --- AWQ's scale search ---------------------------------------------------------------------------

def _roundtrip(w, group_size):
    """int4 in groups, dequantized: the package's quantizer may be used here (the search is the answer)."""
    return dequantize_int4(*quantize_int4_groupwise(w, group_size))


def search_with(weight, x, group_size, grid, statistic="mean", divide="back", measure="output", pick="min",
                fixed=None, group=None, normalise=True, mean_squared=False):
    """The notebook's solution, and (by a switch) each usual slip."""
    stats = {"mean": x.abs().mean(dim=0), "max": x.abs().amax(dim=0), "weight": weight.abs().mean(dim=0),
             "signed": x.mean(dim=0), "output": (x @ weight.T).abs().mean(dim=0)}[statistic]
    y = x @ weight.T
    errors, candidates = [], []
    for alpha in grid:
        s = stats ** alpha
        if normalise:
            s = s / (s.max() * s.min()).sqrt()
        if statistic == "output":                           # scales on the output dimension, W's rows
            w_hat = _roundtrip(weight * s[:, None], group or group_size) / s[:, None]
        else:
            w_hat = _roundtrip(weight * s, group or group_size)
        if divide == "back":
            y_hat = x @ (w_hat / s).T if statistic != "output" else x @ w_hat.T
        elif divide == "activations":                       # (x / s) @ Q(W s).T: the same layer
            y_hat = (x / s) @ w_hat.T
        elif divide == "multiplied":
            y_hat = (x * s) @ w_hat.T
        else:                                               # never divided back
            y_hat = x @ w_hat.T
        if measure == "weight":
            error = torch.linalg.norm(weight - w_hat / s)
        elif mean_squared:
            error = ((y - y_hat) ** 2).mean()
        else:
            error = torch.linalg.norm(y - y_hat)
        errors.append(error.item())
        candidates.append(s)
    if fixed is not None:
        return candidates[[round(a, 6) for a in grid].index(fixed)], errors
    chosen = errors.index(max(errors) if pick == "max" else min(errors))
    return candidates[-1 if pick == "last" else chosen], errors


def reference_search(weight, activations, group_size, grid):           # the notebook's solution
    return search_with(weight, activations, group_size, grid)


def rows_not_columns(weight, activations, group_size, grid):            # s of (in,) on W's rows: a shape error
    s = activations.abs().mean(dim=0)
    _roundtrip(weight * s[:, None], group_size)
    return s, [0.0] * len(grid)


def alpha_not_scales(weight, activations, group_size, grid):          # the best alpha, not its scales
    _, errors = reference_search(weight, activations, group_size, grid)
    return grid[errors.index(min(errors))], errors


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
    accepts(check_awq_search, "reference", reference_search),
    accepts(check_awq_search, "scales-not-normalised", lambda *a: search_with(*a, normalise=False)),
    accepts(check_awq_search, "activations-divided-instead", lambda *a: search_with(*a, divide="activations")),
    accepts(check_awq_search, "mean-squared-error", lambda *a: search_with(*a, mean_squared=True)),
    refuses(check_awq_search, "the-packages-own-search", "write the steps yourself",
            lambda w, x, g, grid: awq_search(w, x, g, grid)),
    refuses(check_awq_search, "the-packages-own-awq-weight", "write the steps yourself",
            lambda w, x, g, grid: (torch.ones(w.shape[1]),
                                   [torch.linalg.norm(x @ (w - awq_weight(w, torch.ones(w.shape[1]), g)).T).item()
                                    for _ in grid])),
    refuses(check_awq_search, "not-divided-back", "divide the dequantized weight back by s",
            lambda *a: search_with(*a, divide="never")),
    refuses(check_awq_search, "activations-multiplied", "divided by s, not multiplied",
            lambda *a: search_with(*a, divide="multiplied")),
    refuses(check_awq_search, "chosen-by-weight-error", "the weight's error",
            lambda *a: search_with(*a, measure="weight")),
    refuses(check_awq_search, "scales-from-the-weights", "weights' magnitude",
            lambda *a: search_with(*a, statistic="weight")),
    refuses(check_awq_search, "max-not-mean", "largest \\|x\\|", lambda *a: search_with(*a, statistic="max")),
    refuses(check_awq_search, "signed-mean", "take \\|x\\| before the mean",
            lambda *a: search_with(*a, statistic="signed")),
    refuses(check_awq_search, "alpha-fixed-at-0.5", "alpha = 0.5, but your own errors are smallest at alpha = 0.4",
            lambda *a: search_with(*a, fixed=0.5)),
    refuses(check_awq_search, "one-alpha-only", "try every alpha",
            lambda w, x, g, grid: search_with(w, x, g, [0.5])),
    refuses(check_awq_search, "largest-error-kept", "the largest error: keep the scales of the smallest",
            lambda *a: search_with(*a, pick="max")),
    refuses(check_awq_search, "last-alphas-scales", "the last alpha tried", lambda *a: search_with(*a, pick="last")),
    refuses(check_awq_search, "alpha-returned", "not alpha itself",
            alpha_not_scales),
    refuses(check_awq_search, "scales-on-the-output-dimension", "output dimension",
            lambda *a: search_with(*a, statistic="output")),
    refuses(check_awq_search, "scales-on-rows", "input channel", rows_not_columns),
    refuses(check_awq_search, "group-size-fixed-at-128", "group_size you are given",
            lambda *a: search_with(*a, group=128)),
    refuses(check_awq_search, "scales-only", "return scales, errors", lambda *a: reference_search(*a)[0]),
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
