"""An int8 KV cache: keys and values stored as 8-bit integers with one scale per token per head.

Introduced in notebook 08 (long context).

At long context a decode step reads the whole cache, so the cache's bytes become the
step's cost (notebook 08 measures where). Storing each key and value in one byte
instead of two (fp16/bf16) or four (fp32) halves or quarters those bytes, up to the
scales' overhead.

The scheme is symmetric absmax quantization, one scale per (row, kv-head, position):
for the head_dim numbers of one token in one head,

    scale = max |x| / 127,    q = round(x / scale)  (an int8 in -127..127),    x ~ q * scale.

A token's scale is fixed when it is written and never changes, so a new token never
forces the old ones to be quantized again (a scale per head over all positions would).
The scales are kept in bfloat16: two bytes with float32's range, so no scale
underflows to zero. A token whose numbers are all zero gets scale 0 and q = 0.

`Int8KVCache` implements the `kv_cache.KVCache` protocol (without fixed-shape writes: no
compiled decode), so `generate` takes it (``cache=Int8KVCache.for_model(...)``). A pass's
writer (`reserve`) quantizes the new keys and values,
stores them, and returns every position so far dequantized to the model's dtype:
attention itself still computes in float. That read is an extra pass over the cache,
so without a kernel that reads int8 inside attention (as serving engines have) the
int8 cache saves memory but need not be faster; notebook 08 measures which.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from .kv_cache import FilledLength
from .models.config import ModelConfig

INT8_MAX = 127                      # symmetric: -127..127, so that q = -q always fits
SCALE_DTYPE = torch.bfloat16        # two bytes, float32's exponent range


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per token per head.

    Introduced in notebook 08 (long context). x: (batch, kv_heads, T, head_dim), any
    float dtype. Returns q, int8 of x's shape, and scales, bfloat16 of shape
    (batch, kv_heads, T, 1), with x ~ q * scales. An all-zero token gets scale 0.
    """
    if x.dim() != 4 or not x.is_floating_point():
        raise LabError(f"quantize_per_token takes float keys or values of shape (batch, kv_heads, T, head_dim), "
                       f"got {x.dtype} of shape {tuple(x.shape)}.")
    absmax = x.float().abs().amax(dim=-1, keepdim=True)                 # (B, H, T, 1)
    scales = (absmax / INT8_MAX).to(SCALE_DTYPE)                        # rounded once, used as stored
    divisor = scales.float().masked_fill(scales == 0, 1.0)              # a zero token: q = 0 / 1 = 0
    q = torch.round(x.float() / divisor).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def dequantize_per_token(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scales in `dtype`: the inverse of `quantize_per_token` up to rounding (at most
    half a scale per number). Introduced in notebook 08 (long context)."""
    return q.to(dtype).mul_(scales.to(dtype))                          # two passes: convert, scale in place


def int8_kv_cache_bytes(config: ModelConfig, length: int, batch_size: int = 1) -> int:
    """Bytes an `Int8KVCache` of `length` positions needs: layers x 2 (K and V) x kv-heads x
    length x batch x (head_dim int8 bytes + one bfloat16 scale). Notebook 08 (long context).

    Against a 16-bit cache the ratio is 2 head_dim / (head_dim + 2): 1.94x for head_dim 64,
    1.97x for 128; against fp32, twice that."""
    scale_bytes = torch.empty((), dtype=SCALE_DTYPE).element_size()
    return (config.num_layers * 2 * config.num_kv_heads * length * batch_size
            * (config.head_dim + scale_bytes))


class Int8KVCache(FilledLength):
    """A `KVCache` that keeps keys and values in int8 with a bfloat16 scale per token per head.

    Introduced in notebook 08 (long context). Storage, preallocated like `StaticKVCache`:
    ``keys``, ``values``: int8 (num_layers, batch_size, num_kv_heads, max_len, head_dim);
    ``key_scales``, ``value_scales``: bfloat16 (num_layers, batch_size, num_kv_heads, max_len, 1).
    `dtype` is the dtype `update` returns (the model's), not the storage's.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if batch_size < 1 or max_len < 1:
            raise LabError(f"batch_size and max_len must be at least 1, got {batch_size} and {max_len}.")
        if max_len > config.max_position:
            raise LabError(f"A cache of {max_len} positions is longer than the model's context of "
                           f"{config.max_position} tokens; shorten the prompt or max_new_tokens.")
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        scale_shape = shape[:-1] + (1,)
        self.keys = torch.zeros(shape, device=device, dtype=torch.int8)
        self.values = torch.zeros(shape, device=device, dtype=torch.int8)
        self.key_scales = torch.zeros(scale_shape, device=device, dtype=SCALE_DTYPE)
        self.value_scales = torch.zeros(scale_shape, device=device, dtype=SCALE_DTYPE)
        self.batch_size, self.max_len, self.length = batch_size, max_len, 0
        self._dtype = dtype

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "Int8KVCache":
        """An int8 cache for `model`: its config and device; reads come back in its dtype.
        Notebook 08 (long context)."""
        return cls(model.config, batch_size, max_len, device=model.device, dtype=model.dtype)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        """Quantize and store one layer's new keys/values at [start, start + T) (reserved by
        `reserve`, kv_cache.py); return every position so far dequantized, each
        (batch, kv_heads, start + T, head_dim). Notebook 08 (long context)."""
        end = start + k.shape[2]
        for store, scales, new in ((self.keys, self.key_scales, k), (self.values, self.value_scales, v)):
            q, s = quantize_per_token(new)                              # (B, H, T, D) int8, (B, H, T, 1)
            store[layer, :, :, start:end] = q
            scales[layer, :, :, start:end] = s
        keys = dequantize_per_token(self.keys[layer, :, :, :end], self.key_scales[layer, :, :, :end], k.dtype)
        values = dequantize_per_token(self.values[layer, :, :, :end], self.value_scales[layer, :, :, :end],
                                      v.dtype)
        return keys, values                                             # each (B, H, length + T, D)

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the int8 keys and values plus their scales."""
        return sum(t.nbytes for t in (self.keys, self.values, self.key_scales, self.value_scales))

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.keys.shape[2]

    @property
    def head_dim(self) -> int:
        return self.keys.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self.keys.device
