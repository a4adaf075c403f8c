"""Checker cases of notebook 04 (quantization): the reference and each typical mistake."""

from types import SimpleNamespace

import torch

import labsupport.checks.quantization as quantization_checks
import labsupport.checks.quantization_awq as awq_checks
import labsupport.checks.quantization_w4a8 as w4a8_checks
from labsupport.checks.quantization import check_int4_pack, check_int8_absmax
from labsupport.checks.quantization_awq import check_awq_search
from labsupport.checks.quantization_w4a8 import check_w4a8_matmul
from labsupport.engine import kv_quant
from labsupport.engine.quant import (Int4Linear, Int8Linear, dequantize_int4, dequantize_int8, formats, pack_int4,
                                     quantize_int4_groupwise, quantize_int8_absmax, unpack_int4)
from labsupport.engine.quant import w4a8 as w4a8_engine
from labsupport.engine.quant.w4a8 import pack_q4_1, quantize_activations
from labsupport.explorers import quantization as quantization_explorer
from labsupport.lab import quantization_error
from labsupport.lab.quantization_awq import awq_search, awq_weight, output_error, scales_for

from checker_cases.common import accepts, refuses

OWN_CODE = "expected your own code"


# --- notebook 04 (quantization): int8 absmax -------------------------------------------------

def quantize_int8(w):                         # the notebook's solution
    scale = w.abs().amax(dim=1) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def dequantize(q, scale):                     # the notebook's solution
    return q.float() * scale[:, None]


def quantize_by_default(w, _quantize=quantize_int8_absmax):
    return _quantize(w)


def _closure_of(function):
    def learner(*args):
        return function(*args)
    return learner


def _dequantize_helper(q, scale):
    return dequantize_int8(q, scale)


def dequantize_through_a_helper(q, scale):
    return _dequantize_helper(q, scale)


def _linear(weight):
    """What an int8 or int4 layer reads of an nn.Linear (a plain namespace: tests/test_quantization_grading.py
    says why not nn.Linear itself)."""
    return SimpleNamespace(weight=weight, bias=None, in_features=weight.shape[1], out_features=weight.shape[0])


def quantize_by_int8_linear(w):               # the engine's int8 layer quantizes its weight
    layer = Int8Linear.from_linear(_linear(w.clone()), kernel="reference")
    return layer.weight_int8, layer.scales.float()


def quantize_per_token_of_the_kv_cache(w):    # notebook 08's int8 cache: one scale per token (row)
    q, scales = kv_quant.quantize_per_token(w[None, None])
    return q[0, 0], scales[0, 0, :, 0].float()


def dequantize_per_token_of_the_kv_cache(q, scale):
    return kv_quant.dequantize_per_token(q[None, None], scale[None, None, :, None], torch.float32)[0, 0]


def quantize_by_a_built_name(w):              # no walk sees the name: the stand-in refuses the call
    return getattr(formats, "quantize_" + "int8_absmax")(w)

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


def pack(q):                                  # the notebook's solution
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=1)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack(packed, columns):                  # the notebook's solution
    return interleave(packed)[:, :columns]


def pack_by_default(q, _pack=pack_int4):
    return _pack(q)


def _unpack_helper(packed):
    return unpack_int4(packed)


def unpack_through_a_helper(packed, columns):
    return _unpack_helper(packed)[:, :columns]


def pack_by_the_kernels_layout(q):            # pack_q4_1 stores q[j] | q[j + 16] << 4 per block of 32
    rows, columns = q.shape
    padded = torch.cat([q, q.new_zeros(rows, -columns % 32)], dim=1).to(torch.uint8)
    blocks = padded.reshape(rows, -1, 16, 2).transpose(2, 3).reshape(rows, -1)     # pairs at j, j + 16
    ones = torch.ones(rows, blocks.shape[1] // 32)
    return pack_q4_1(blocks, ones, ones)[0][:, :(columns + 1) // 2]


def unpack_by_int4_linear(packed, columns):   # the engine's int4 layer unpacks its weight
    rows, width = packed.shape[0], 2 * packed.shape[1]
    layer = Int4Linear.from_linear(_linear(torch.zeros(rows, width)), group_size=width, kernel="reference")
    layer.packed, layer.scales, layer.zeros = packed, torch.ones(rows, 1), torch.zeros(rows, 1)
    layer.in_features = columns
    return layer.dequantized_weight().round().to(torch.uint8)


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


def search_with_the_labs_helpers(weight, activations, group_size, grid):    # the lab's steps of the search
    mean_abs = activations.abs().mean(dim=0)
    errors, candidates = [], []
    for alpha in grid:
        s = scales_for(mean_abs, alpha)
        errors.append(output_error(weight, awq_weight(weight, s, group_size), activations))
        candidates.append(s)
    return candidates[errors.index(min(errors))], errors


def search_with_the_labs_output_error(weight, activations, group_size, grid):
    scales, _ = reference_search(weight, activations, group_size, grid)
    errors = [output_error(weight, _roundtrip(weight * scales_of(activations, a), group_size)
                           / scales_of(activations, a), activations) for a in grid]
    return scales, errors


def scales_of(activations, alpha):
    s = activations.abs().mean(dim=0) ** alpha
    return s / (s.max() * s.min()).sqrt()


def search_with_the_checkers_curve(weight, activations, group_size, grid):     # the checker's own slip helper
    scales, _ = reference_search(weight, activations, group_size, grid)
    return scales, awq_checks._curve(weight, activations, group_size, grid, activations.abs().mean(dim=0))


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


def float_path_by_blocks(x, q, scales, mins, dtype=torch.float32):
    """Right integer sums beside a y from the float path, block by block: the dequantized activations
    times the dequantized weights, a float matmul along 32 per block (none along k)."""
    _, sums = w4a8_matmul(x, q, scales, mins)
    M, k = x.shape
    n, blocks = q.shape[0], k // 32
    xb = x.float().reshape(M, blocks, 32)
    dx = xb.abs().amax(dim=-1) / 127
    qx = torch.round(xb / torch.where(dx > 0, dx, 1.0)[..., None]).clamp(-127, 127)
    y = torch.zeros(M, n, dtype=dtype)
    for b in range(blocks):
        x_hat = (qx[:, b] * dx[:, b, None]).to(dtype)                                      # (M, 32)
        w_hat = q[:, 32 * b:32 * (b + 1)].to(dtype) * scales[:, b, None].to(dtype) + mins[:, b, None].to(dtype)
        y = y + x_hat @ w_hat.T
    return y.float(), sums


def float_path_elementwise(x, q, scales, mins):
    """The float path without a matmul: (w_hat * x_hat) summed over each block."""
    _, sums = w4a8_matmul(x, q, scales, mins)
    M, k = x.shape
    n, blocks = q.shape[0], k // 32
    xb = x.float().reshape(M, blocks, 32)
    dx = xb.abs().amax(dim=-1, keepdim=True) / 127
    x_hat = torch.round(xb / torch.where(dx > 0, dx, 1.0)).clamp(-127, 127) * dx                 # (M, blocks, 32)
    w_hat = q.float().reshape(n, blocks, 32) * scales[..., None] + mins[..., None]             # (n, blocks, 32)
    return (x_hat[:, None] * w_hat[None]).sum(dim=(-1, -2)), sums


def float_min_term(x, q, scales, mins):
    """Integer sums for the scale's term, the float activations for the minimum's: min * sum(qx * dx)."""
    M, k = x.shape
    blocks = k // 32
    _, sums = w4a8_matmul(x, q, scales, mins)
    xb = x.float().reshape(M, blocks, 32)
    dx = xb.abs().amax(dim=-1) / 127
    x_hat = torch.round(xb / torch.where(dx > 0, dx, 1.0)[..., None]).clamp(-127, 127) * dx[..., None]
    return (scales[None] * dx[:, None] * sums).sum(-1) + (mins[None] * x_hat.sum(-1)[:, None]).sum(-1), sums


def w4a8_with_the_packages_activations(x, q, scales, mins):
    qx, dx = quantize_activations(x)
    qx = qx.reshape(x.shape[0], -1, 32).to(torch.int32)
    sums = (qx[:, None] * q.reshape(q.shape[0], -1, 32).to(torch.int32)[None]).sum(-1)
    return (scales[None] * dx[:, None] * sums + mins[None] * (dx * qx.sum(-1))[:, None]).sum(-1), sums


def w4a8_y_of_the_labs_reference(x, q, scales, mins):
    _, sums = w4a8_matmul(x, q, scales, mins)
    return quantization_error.w4a8_reference(x, *pack_q4_1(q, scales, mins)), sums


def w4a8_y_of_the_engines_kernel(x, q, scales, mins):
    _, sums = w4a8_matmul(x, q, scales, mins)
    return w4a8_engine.w4a8_linear(x, *pack_q4_1(q, scales, mins)), sums


def w4a8_y_of_dequantize_int4(x, q, scales, mins, _dequantize=dequantize_int4):
    _, sums = w4a8_matmul(x, q, scales, mins)
    qx, dx = w4a8_matmul_activations(x)
    return (qx * dx[..., None]).reshape(x.shape) @ _dequantize(q, scales, mins).T, sums


def w4a8_matmul_activations(x):
    xb = x.float().reshape(x.shape[0], -1, 32)
    dx = xb.abs().amax(dim=-1) / 127
    return torch.round(xb / torch.where(dx > 0, dx, 1.0)[..., None]).clamp(-127, 127), dx


NOTEBOOK_04 = [
    accepts(check_int8_absmax, "reference", quantize_int8, dequantize),
    accepts(check_int8_absmax, "without-clamp", without_clamp, dequantize),
    refuses(check_int8_absmax, "per-tensor-scale", "per row", per_tensor, dequantize),
    refuses(check_int8_absmax, "per-column-scale", "per column", per_column, dequantize),
    refuses(check_int8_absmax, "scale-over-128", "127", scale_over_128, dequantize),
    refuses(check_int8_absmax, "scale-over-128-without-clamp", "wraps around", scale_over_128_without_clamp,
            dequantize),
    refuses(check_int8_absmax, "scale-over-255", "signed", scale_over_255, dequantize),
    refuses(check_int8_absmax, "no-rounding", "round", no_round, dequantize),
    refuses(check_int8_absmax, "truncated-not-rounded", "cuts the fraction off", truncated, dequantize),
    refuses(check_int8_absmax, "one-scale-to-dequantize", "round trip",
            quantize_int8, lambda q, scale: q.float() * scale.mean()),
    refuses(check_int8_absmax, "divided-by-the-scale", "do not divide",
            quantize_int8, lambda q, scale: q.float() / scale[:, None]),
    refuses(check_int8_absmax, "scale-without-a-column-axis", r"scale\[:, None\]",
            quantize_int8, lambda q, scale: q.float() * scale),
    # the package's int8 code, however it is held
    refuses(check_int8_absmax, "the-packages-own-pair", OWN_CODE, quantize_int8_absmax, dequantize_int8),
    refuses(check_int8_absmax, "the-packages-quantize", OWN_CODE, quantize_int8_absmax, dequantize),
    refuses(check_int8_absmax, "the-packages-dequantize", OWN_CODE, quantize_int8, dequantize_int8),
    refuses(check_int8_absmax, "quantize-as-a-default-argument", OWN_CODE, quantize_by_default, dequantize),
    refuses(check_int8_absmax, "quantize-in-a-closure", OWN_CODE, _closure_of(quantize_int8_absmax), dequantize),
    refuses(check_int8_absmax, "dequantize-through-a-helper", OWN_CODE, quantize_int8, dequantize_through_a_helper),
    refuses(check_int8_absmax, "int8-linear-from-linear", "Int8Linear", quantize_by_int8_linear, dequantize),
    refuses(check_int8_absmax, "the-int8-kv-caches-quantizer", "quantize_per_token",
            quantize_per_token_of_the_kv_cache, dequantize),
    refuses(check_int8_absmax, "the-int8-kv-caches-dequantizer", "dequantize_per_token",
            quantize_int8, dequantize_per_token_of_the_kv_cache),
    refuses(check_int8_absmax, "quantize-by-a-built-name", "quantize_int8_absmax", quantize_by_a_built_name, dequantize),
    refuses(check_int8_absmax, "through-the-checkers-module", OWN_CODE,
            lambda w: quantization_checks.quantize_int8_absmax(w), dequantize),
    refuses(check_int8_absmax, "through-a-lab-module", OWN_CODE,
            quantize_int8, lambda q, scale: quantization_error.dequantize_int8(q, scale)),
    accepts(check_int4_pack, "reference", pack, unpack),
    refuses(check_int4_pack, "swapped-nibbles", "swapped", swapped_nibbles, unpack),
    refuses(check_int4_pack, "int32-bytes", "uint8", lambda q: pack(q).to(torch.int32), unpack),
    refuses(check_int4_pack, "signed-offset-when-packing", "offset of 8", signed_offset, unpack),
    refuses(check_int4_pack, "odd-width-not-padded", "pair it with a zero", no_padding, unpack),
    refuses(check_int4_pack, "odd-width-padding-kept", "padding nibble", pack,
            lambda packed, columns: interleave(packed)),
    refuses(check_int4_pack, "signed-offset-when-unpacking", "offset of 8", pack,
            lambda packed, columns: interleave(packed)[:, :columns].to(torch.int16) - 8),
    refuses(check_int4_pack, "halves-not-interleaved", "interleave",
            pack, lambda packed, columns: torch.cat([packed & 0x0F, packed >> 4], dim=1)[:, :columns]),
    refuses(check_int4_pack, "unpacked-high-first", "low and high are swapped", pack,
            lambda packed, columns: torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(packed.shape[0], -1)[:, :columns]),
    refuses(check_int4_pack, "unpacked-without-reshape", "wrong shape",
            pack, lambda packed, columns: torch.stack([packed & 0x0F, packed >> 4], dim=-1)),
    # the package's packing, however it is held
    refuses(check_int4_pack, "the-packages-own-pair", OWN_CODE, pack_int4, unpack_int4),
    refuses(check_int4_pack, "the-packages-pack", OWN_CODE, pack_int4, unpack),
    refuses(check_int4_pack, "the-packages-unpack", OWN_CODE, pack, unpack_int4),
    refuses(check_int4_pack, "pack-as-a-default-argument", OWN_CODE, pack_by_default, unpack),
    refuses(check_int4_pack, "unpack-in-a-closure", OWN_CODE, pack, _closure_of(unpack_int4)),
    refuses(check_int4_pack, "unpack-through-a-helper", OWN_CODE, pack, unpack_through_a_helper),
    refuses(check_int4_pack, "the-w4a8-kernels-packing", "pack_q4_1", pack_by_the_kernels_layout, unpack),
    refuses(check_int4_pack, "the-int4-layers-unpacking", "Int4Linear", pack, unpack_by_int4_linear),
    refuses(check_int4_pack, "through-the-explorers-import", OWN_CODE,
            lambda q: quantization_explorer.pack_int4(q), unpack),
    refuses(check_int4_pack, "through-the-checkers-module", OWN_CODE,
            pack, lambda packed, columns: quantization_checks.unpack_int4(packed, columns)),
    accepts(check_awq_search, "reference", reference_search),
    accepts(check_awq_search, "scales-not-normalised", lambda *a: search_with(*a, normalise=False)),
    accepts(check_awq_search, "activations-divided-instead", lambda *a: search_with(*a, divide="activations")),
    accepts(check_awq_search, "mean-squared-error", lambda *a: search_with(*a, mean_squared=True)),
    refuses(check_awq_search, "the-packages-own-search", OWN_CODE,
            lambda w, x, g, grid: awq_search(w, x, g, grid)),
    refuses(check_awq_search, "the-packages-own-awq-weight", OWN_CODE,
            lambda w, x, g, grid: (torch.ones(w.shape[1]),
                                   [torch.linalg.norm(x @ (w - awq_weight(w, torch.ones(w.shape[1]), g)).T).item()
                                    for _ in grid])),
    refuses(check_awq_search, "search-as-a-default-argument", OWN_CODE,
            lambda w, x, g, grid, _search=awq_search: _search(w, x, g, grid)),
    refuses(check_awq_search, "search-in-a-closure", OWN_CODE, _closure_of(awq_search)),
    refuses(check_awq_search, "the-labs-steps", OWN_CODE, search_with_the_labs_helpers),
    refuses(check_awq_search, "the-labs-output-error", "output_error", search_with_the_labs_output_error),
    refuses(check_awq_search, "the-checkers-own-curve", "_curve", search_with_the_checkers_curve),
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
    # the right numbers by the float path, beside right integer sums: the method is refused
    refuses(check_w4a8_matmul, "float-y-beside-integer-sums", "build y from sums",
            lambda *a: (w4a8_matmul(*a, dequantized=True)[0], w4a8_matmul(*a)[1])),
    refuses(check_w4a8_matmul, "float-path-block-by-block", "build y from sums", float_path_by_blocks),
    refuses(check_w4a8_matmul, "float64-path-block-by-block", "build y from sums",
            lambda *a: float_path_by_blocks(*a, dtype=torch.float64)),
    refuses(check_w4a8_matmul, "float-path-elementwise", "build y from sums", float_path_elementwise),
    refuses(check_w4a8_matmul, "float-activations-for-the-minimums-term", "dequantized activations", float_min_term),
    # the package's W4A8 code
    refuses(check_w4a8_matmul, "the-packages-activation-quantizer", "quantize_activations",
            w4a8_with_the_packages_activations),
    refuses(check_w4a8_matmul, "the-labs-reference", "w4a8_reference", w4a8_y_of_the_labs_reference),
    refuses(check_w4a8_matmul, "the-engines-kernel", "w4a8_linear", w4a8_y_of_the_engines_kernel),
    refuses(check_w4a8_matmul, "dequantize-int4-as-a-default-argument", "dequantize_int4", w4a8_y_of_dequantize_int4),
    refuses(check_w4a8_matmul, "through-the-checkers-module", OWN_CODE,
            lambda x, q, s, m: (w4a8_checks.w4a8_reference(x, *pack_q4_1(q, s, m)), w4a8_matmul(x, q, s, m)[1])),
]


# --- mutants of the notebook's solutions that compute what the solution computes (scripts/checker_mutants.py) ---

_CLAMP_INERT = ("the clamp is never reached: with scale = max|w| / 127 per row, |w| / scale is at most 127 (times "
                "one float rounding), so round(w / scale) lies in -127..127 and a bound of 128 or -128 changes nothing")
_X_CLAMP_INERT = ("the clamp is never reached: with dx = max|x| / 127 per block, |x| / dx is at most 127 (times one "
                  "float rounding), so round(x / dx) lies in -127..127 and a bound of 128 or -128 changes nothing")
_ANY_FACTOR = ("a positive constant factor on s (here per alpha) scales each group's min and step alike, so "
               "Q(W * c s) / (c s) = Q(W * s) / s: the same errors and the same layer; the exercise accepts scales "
               "up to a constant factor ('any factor passes'), the normalisation only keeps s near 1")
EQUIVALENT_MUTANTS = {
    "ex1_int8_absmax": {"4:47:constant:127+1": _CLAMP_INERT, "4:52:constant:127+1": _CLAMP_INERT},
    "ex2_int4_pack": {"6:16:slice:drop-lower": "q[:, ::2] is q[:, 0::2]: a slice's lower bound defaults to 0"},
    "ex3_int4_layer": {"8:12:operator:Div->Mult": _ANY_FACTOR, "8:12:drop-term:keep-left": _ANY_FACTOR,
                       "8:17:operator:Mult->Div": _ANY_FACTOR, "8:17:drop-term:keep-left": _ANY_FACTOR,
                       "8:17:drop-term:keep-right": _ANY_FACTOR},
    "ex4_w4a8_matmul": {"7:74:constant:127+1": _X_CLAMP_INERT, "7:79:constant:127+1": _X_CLAMP_INERT,
                        "7:50:constant:1.0*2": "the divisor only stands in where dx = 0, where the block is all "
                                               "zeros: 0 / 1 and 0 / 2 both round to qx = 0"},
}
