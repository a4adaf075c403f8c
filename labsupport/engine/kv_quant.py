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
The scales are kept in bfloat16: two bytes with float32's range. Every finite number
stays finite and within half a scale (plus the rounding to its dtype):

* a scale is rounded UP to a bfloat16 (never to zero for a non-zero token), so that
  |x| / scale <= 127: rounded down, the largest number would be clipped (by far, when the
  scale is one of bfloat16's coarse subnormals);
* dequantization multiplies in float32, where q * scale is exact, and rounds once to the
  model's dtype: in float16 a small scale would itself round to a subnormal, and 127 x a
  rounded-up scale can pass the dtype's largest number, so the result is clamped to it.

A token whose numbers are all zero gets scale 0 and q = 0.

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
from ..inputs import whole_number
from .hardware import as_dtype, pick_device
from .kv_cache import FilledLength, LayerBuffers
from .config import ModelConfig

INT8_MAX = 127                      # symmetric: -127..127, so that q = -q always fits
SCALE_DTYPE = torch.bfloat16        # two bytes, float32's exponent range


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per token per head.

    Introduced in notebook 08 (long context). x: (batch, kv_heads, T, head_dim), any
    float dtype. Returns q, int8 of x's shape, and scales, bfloat16 of shape
    (batch, kv_heads, T, 1), with x ~ q * scales: each scale is max|x| / 127 rounded up to a
    bfloat16, so that no |x| / scale passes 127. An all-zero token gets scale 0.
    """
    if x.dim() != 4 or not x.is_floating_point():
        raise LabError(f"quantize_per_token takes float keys or values of shape (batch, kv_heads, T, head_dim), "
                       f"got {x.dtype} of shape {tuple(x.shape)}.")
    absmax = x.float().abs().amax(dim=-1, keepdim=True)                 # (B, H, T, 1)
    if x.dtype == torch.float64 and bool((absmax > torch.finfo(SCALE_DTYPE).max).any()):
        raise LabError("float64 keys or values beyond 3.4e38 do not fit bfloat16 scales; the int8 cache stores "
                       "model activations (float32, float16, bfloat16).")
    scales = (absmax / INT8_MAX).to(SCALE_DTYPE)                        # the nearest bfloat16 ...
    below = scales.float() * INT8_MAX < absmax                          # (exact: 8 bits x 7 bits)
    scales = torch.where(below, torch.nextafter(scales, torch.full_like(scales, float("inf"))), scales)
    divisor = scales.float().masked_fill(scales == 0, 1.0)              # a zero token: q = 0 / 1 = 0
    q = torch.round(x.float() / divisor).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def dequantize_per_token(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scales in `dtype`: the inverse of `quantize_per_token` up to rounding (at most
    half a scale per number, plus the rounding to `dtype`), finite for every finite input.
    Introduced in notebook 08 (long context)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # where q * scale is exact
    largest = torch.finfo(dtype).max                                   # 127 x a rounded-up scale may pass it
    return q.to(wide).mul_(scales.to(wide)).clamp_(-largest, largest).to(dtype)   # rounded once


def int8_kv_cache_bytes(config: ModelConfig, length: int, batch_size: int = 1) -> int:
    """Bytes an `Int8KVCache` of `length` positions needs: layers x 2 (K and V) x kv-heads x
    length x batch x (head_dim int8 bytes + one bfloat16 scale). Notebook 08 (long context).

    Against a 16-bit cache the ratio is 2 head_dim / (head_dim + 2): 1.94x for head_dim 64,
    1.97x for 128; against fp32, twice that."""
    scale_bytes = torch.empty((), dtype=SCALE_DTYPE).element_size()
    return (config.num_layers * 2 * config.num_kv_heads * length * batch_size
            * (config.head_dim + scale_bytes))


class Int8KVCache(LayerBuffers, FilledLength):
    """A `KVCache` that keeps keys and values in int8 with a bfloat16 scale per token per head.

    Introduced in notebook 08 (long context). Storage, preallocated like `StaticKVCache`:
    ``keys``, ``values``: int8 (num_layers, batch_size, num_kv_heads, max_len, head_dim);
    ``key_scales``, ``value_scales``: bfloat16 (num_layers, batch_size, num_kv_heads, max_len, 1).
    `dtype` is the dtype `update` returns (the model's), not the storage's.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if not isinstance(config, ModelConfig):
            raise LabError(f"config must be a ModelConfig (model.config), got {type(config).__name__}.")
        batch_size = whole_number(batch_size, "batch_size (rows of the int8 cache)")
        max_len = whole_number(max_len, "max_len (positions the int8 cache holds)")
        device = pick_device(device)                                    # a typo or a missing GPU: one sentence
        dtype = as_dtype(dtype)                                         # the dtype update returns: the model's
        if not dtype.is_floating_point:
            raise LabError(f"dtype is the float dtype update returns (the model's), got {dtype}.")
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
        self._check_update(layer, k, v)
        end = start + k.shape[2]
        for store, scales, new in ((self.keys, self.key_scales, k), (self.values, self.value_scales, v)):
            q, s = quantize_per_token(new)                              # (B, H, T, D) int8, (B, H, T, 1)
            store[layer, :, :, start:end] = q
            scales[layer, :, :, start:end] = s
        keys = dequantize_per_token(self.keys[layer, :, :, :end], self.key_scales[layer, :, :, :end], k.dtype)
        values = dequantize_per_token(self.values[layer, :, :, :end], self.value_scales[layer, :, :, :end],
                                      v.dtype)
        return keys, values                                             # each (B, H, length + T, D)

    def _check_update(self, layer, k, v) -> None:
        """One sentence for a layer outside the model or keys/values of the wrong shape or kind."""
        layers = self.keys.shape[0]
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < layers:
            raise LabError(f"layer must be a whole number from 0 to {layers - 1}, got {layer!r}.")
        want = (self.batch_size, self.keys.shape[2], "T", self.keys.shape[4])
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 4 or \
                    (x.shape[0], x.shape[1], x.shape[3]) != (want[0], want[1], want[3]):
                got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise LabError(f"{name} must be float keys or values of shape (batch, kv_heads, T, head_dim) = "
                               f"{want}, got {got}.")
        if k.shape != v.shape:
            raise LabError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}.")

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the int8 keys and values plus their scales."""
        return sum(t.nbytes for t in (self.keys, self.values, self.key_scales, self.value_scales))

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

