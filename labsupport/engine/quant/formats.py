"""Weight-only quantization formats: int8 absmax and int4 groupwise, and what they cost.

Introduced in notebook 04 (quantization).

Each weight is stored as a small integer plus a scale shared by many weights;
the activations stay in floating point:

* int8, absmax, per output channel (symmetric): scale = max|w| / 127 for each
  row, q = round(w / scale) in -127..127, w ~ q * scale. 8 bits per weight plus
  one scale per row: about 25% of fp32.
* int4, groupwise, asymmetric (min/max): each row is cut into groups of
  `group_size` consecutive input features; per group scale = (max - min) / 15
  and zero = min, q = round((w - zero) / scale) in 0..15, w ~ q * scale + zero.
  Two values are packed into one byte. 4 bits per weight plus a scale and a
  zero per group: about 12.5% of fp32 plus 2 x 16 / group_size bits.

Zero: the int8 grid is symmetric (-127..127 steps of `scale`), so a weight of exactly
0 is a grid point and comes back exactly 0. The int4 grid starts at each group's
minimum (`zero`), so 0 is in general between two levels and comes back a little off:
an asymmetric grid trades exact zero for using all 16 levels on the group's range.

The layers that compute with these weights are in kernels.py.
"""

from __future__ import annotations

import torch

from ...errors import LabError


def require_weight_matrix(w: torch.Tensor) -> None:
    """One sentence unless `w` is a 2-D floating-point weight matrix. Notebook 04 (quantization)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise LabError("Quantization expects a 2-D floating-point weight matrix (out_features, in_features).")


def quantize_int8_absmax(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8, one scale per output channel (row). Notebook 04 (quantization).

    Returns q: int8 (out, in) in -127..127 and scale: float32 (out,), with w ~ q * scale[:, None].
    """
    require_weight_matrix(w)
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127                    # (out,)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)     # (out, in)
    q = q.contiguous()                  # row-major, whatever layout the weight had (engine/models/layout.py)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q (out, in) int8 and scale (out,) -> the approximate weight (out, in) in `dtype`.
    Notebook 04 (quantization)."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def require_group_size(group_size: int, in_features: int | None = None) -> None:
    """Refuse group sizes that are not an even integer >= 2 (two 4-bit values share a byte)
    or, when `in_features` is given, that cannot cut a row into whole groups. Notebook 04 (quantization)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise LabError(f"group_size must be an even integer of at least 2, got {group_size!r}.")
    if in_features is not None and in_features % group_size:
        divisors = [g for g in (16, 32, 64, 96, 128, 192, 256) if in_features % g == 0] or [in_features]
        raise LabError(f"group_size {group_size} does not divide in_features {in_features}; "
                       f"choose a divisor such as {', '.join(map(str, divisors))}.")


def quantize_int4_groupwise(w: torch.Tensor, group_size: int = 32):
    """Asymmetric int4 in groups of `group_size` input features (min/max per group).
    Notebook 04 (quantization).

    Returns q: uint8 (out, in) with values 0..15, scales and zeros: float32
    (out, in / group_size), with w ~ q * scale + zero (zero is the group minimum).
    """
    require_weight_matrix(w)
    out_features, in_features = w.shape
    require_group_size(group_size, in_features)
    groups = w.float().reshape(out_features, in_features // group_size, group_size)  # (out, G, g)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)                             # (out, G)
    scales = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15)
    return q.to(torch.uint8).reshape(out_features, in_features).contiguous(), scales, low


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    dtype=torch.float32) -> torch.Tensor:
    """q (out, in) 0..15 with scales, zeros (out, in / group) -> weight (out, in) in `dtype`.
    Notebook 04 (quantization)."""
    out_features, in_features = q.shape
    group_size = in_features // scales.shape[1]
    groups = q.float().reshape(out_features, -1, group_size)                 # (out, G, g)
    w = groups * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(out_features, in_features).to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit values per byte: column 2j in the low nibble, 2j + 1 in the high one.
    q: (out, in) values 0..15 -> uint8 (out, ceil(in / 2)); an odd last column is paired
    with a zero high nibble (`unpack_int4(packed, in)` drops it). Notebook 04 (quantization)."""
    if q.dim() != 2 or q.is_floating_point() or (q.numel() and (int(q.min()) < 0 or int(q.max()) > 15)):
        raise LabError("pack_int4 takes a 2-D integer tensor of values 0..15 (out_features, in_features).")
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=1)               # (out, in + 1): a zero to pair with
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor, columns: int | None = None) -> torch.Tensor:
    """The inverse of `pack_int4`: uint8 (out, in / 2) -> uint8 (out, columns) values 0..15
    (columns: the original count, default every nibble). Notebook 04 (quantization)."""
    low, high = packed & 0x0F, packed >> 4
    q = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)       # interleave: (out, 2 * in / 2)
    if columns is not None and not 2 * packed.shape[1] - 1 <= columns <= 2 * packed.shape[1]:
        raise LabError(f"{packed.shape[1]} bytes per row hold {2 * packed.shape[1] - 1} or "
                       f"{2 * packed.shape[1]} values, not {columns}; give the row's original length.")
    return q if columns is None else q[:, :columns]

