"""Checker cases of notebook 04 (quantization): the reference and each typical mistake."""

import torch

from labsupport.checks.quantize import check_int4_pack, check_int8_absmax
from labsupport.quantize import dequantize_int8, pack_int4, quantize_int8_absmax, unpack_int4

from checker_cases.common import accepts, refuses


# --- notebook 04 (quantization) -----------------------------------------------------------

def per_tensor(w):
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def scale_over_128(w):
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def scale_over_255(w):
    scale = w.abs().amax(dim=1) / 255
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def no_round(w):
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]), scale


def swapped_nibbles(q):
    q = q.to(torch.uint8)
    return q[:, 1::2] | (q[:, 0::2] << 4)


NOTEBOOK_04 = [
    accepts(check_int8_absmax, "reference", quantize_int8_absmax, dequantize_int8),
    refuses(check_int8_absmax, "per-tensor-scale", "per row", per_tensor, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-128", "127", scale_over_128, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-255", "signed", scale_over_255, dequantize_int8),
    refuses(check_int8_absmax, "no-rounding", "round", no_round, dequantize_int8),
    refuses(check_int8_absmax, "one-scale-to-dequantize", "round trip",
            quantize_int8_absmax, lambda q, scale: q.float() * scale.mean()),
    accepts(check_int4_pack, "reference", pack_int4, unpack_int4),
    refuses(check_int4_pack, "swapped-nibbles", "swapped", swapped_nibbles, unpack_int4),
    refuses(check_int4_pack, "int32-bytes", "uint8", lambda q: pack_int4(q).to(torch.int32), unpack_int4),
    refuses(check_int4_pack, "halves-not-interleaved", "interleave",
            pack_int4, lambda packed: torch.cat([packed & 0x0F, packed >> 4], dim=1)),
    refuses(check_int4_pack, "unpacked-high-first", "low and high are swapped",
            pack_int4, lambda packed: torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(packed.shape[0], -1)),
    refuses(check_int4_pack, "unpacked-without-reshape", "wrong shape",
            pack_int4, lambda packed: torch.stack([packed & 0x0F, packed >> 4], dim=-1)),
]
