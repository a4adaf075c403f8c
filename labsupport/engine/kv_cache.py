"""The key/value cache: remember each layer's keys and values so that a decode
step only computes the newest token.

Introduced in notebook 01 (KV cache).

Without a cache, generating token t re-runs the model over all t previous
tokens, so n tokens cost O(n^2) token-forwards. With a cache, each step runs the
model on one new token and attends to the stored keys and values.

`StaticKVCache` preallocates the whole buffer once, for `batch_size` rows and
`max_len` positions, so decoding never allocates memory (this is also what lets
a GPU capture a decode step in a CUDA graph). Every row of the batch shares one
write position, `length`; batched generation lines prompts up with left padding
(notebook 02) so that this holds. Speculative decoding rolls the cache back with
`truncate` (notebook 05); the paged cache of notebook 06 keeps the same
positions in fixed-size blocks.

The extension point is declared, not implied: `KVWriter` is what one forward pass
of the `Transformer` needs (`update`), and `KVCache` adds what a generation loop
needs across passes (`length`, `advance`, `truncate`, and its size). `generate`,
`speculative_generate` and the drafts take any `KVCache` (default: a
`StaticKVCache`), checked by `require_fitting_cache`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..errors import LabError
from .models.config import ModelConfig


def kv_cache_bytes(config: ModelConfig, length: int, batch_size: int = 1,
                   dtype: torch.dtype = torch.float32) -> int:
    """Bytes needed to cache `length` positions:
    layers x 2 (K and V) x kv-heads x head-dim x length x batch x bytes. Notebook 01 (KV cache)."""
    bytes_per_value = torch.empty((), dtype=dtype).element_size()
    return (config.num_layers * 2 * config.num_kv_heads * config.head_dim
            * length * batch_size * bytes_per_value)


@runtime_checkable
class KVWriter(Protocol):
    """What one forward pass of the `Transformer` needs from a cache (notebook 01).

    `update(layer, k, v)`: k and v are the new tokens' keys and values of one layer,
    (batch, kv_heads, T, head_dim); it stores them and returns the keys and values
    those T queries attend to, each (batch, kv_heads, S, head_dim), S >= T, in
    position order, with the new ones last among the real ones (the attention mask
    hides the rest). Called once per layer, in layer order, per forward pass.
    """

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ...


@runtime_checkable
class KVCache(KVWriter, Protocol):
    """A cache a generation loop can drive across forward passes (notebook 01): the
    extension point of `generate` and speculative decoding.

    Every row of the batch shares one fill level:

    * `batch_size`: rows; `max_len`: positions each row can hold;
    * `length`: positions filled so far, 0 <= length <= max_len;
    * `update(layer, k, v)` (see `KVWriter`): stores at positions [length, length + T)
      and returns positions [0, length + T), so S = length + T; it raises a LabError
      rather than write past `max_len`. It leaves `length` alone, for:
    * `advance(n)`: `length += n`, once every layer of a pass has stored its share
      (`Transformer.forward` calls it);
    * `truncate(length)`: forget every position from `length` on (speculative
      decoding's rollback; `truncate(0)` empties the cache).

    Implemented by `StaticKVCache` and by the paged cache's `PagedRows`
    (serving/paged_cache.py, notebook 06).
    """

    batch_size: int
    max_len: int
    length: int

    def advance(self, n: int) -> None:
        ...

    def truncate(self, length: int) -> None:
        ...


class FilledLength:
    """The bookkeeping every `KVCache` here shares: `length` positions of every row are
    filled; `advance` moves it on once per forward pass, `truncate` rolls it back.
    Notebook 01 (KV cache); the rollback is notebook 05's (speculative decoding).
    """

    length: int = 0

    def advance(self, n: int) -> None:
        """Mark `n` more positions as filled (called once per forward pass)."""
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding's rollback)."""
        if not 0 <= length <= self.length:
            raise LabError(f"Cannot truncate a cache of length {self.length} to {length}.")
        self.length = length


class StaticKVCache(FilledLength):
    """Preallocated keys and values for every layer of a model: the `KVCache` of
    notebook 01 (KV cache).

    Storage: ``keys`` and ``values`` of shape
    (num_layers, batch_size, num_kv_heads, max_len, head_dim).
    ``length`` positions (the same for every row) are filled.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if batch_size < 1:
            raise LabError(f"batch_size must be at least 1, got {batch_size}.")
        if max_len < 1:
            raise LabError(f"max_len must be at least 1, got {max_len}.")
        if max_len > config.max_position:
            raise LabError(
                f"A cache of {max_len} positions is longer than the model's context of "
                f"{config.max_position} tokens; shorten the prompt or max_new_tokens."
            )
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "StaticKVCache":
        """A cache with `model`'s config, device and dtype: the default cache of `generate`
        and the default `cache_factory` of a speculative draft (notebooks 01 and 05)."""
        return cls(model.config, batch_size, max_len, device=model.device, dtype=model.dtype)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store the new keys/values of one layer at positions [length, length + T)
        and return all keys/values so far, each (batch, kv_heads, length + T, head_dim).

        `k` and `v` are (batch, kv_heads, T, head_dim). `length` itself moves on only
        in `advance`, once every layer has stored its share.
        """
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise LabError(
                f"The KV cache holds {self.max_len} positions and this step needs {end}; "
                "make the cache longer (max_len) or generate fewer tokens."
            )
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def writer_at(self, positions: torch.Tensor) -> "FixedShapeWriter":
        """An `update` that writes at the given positions (a tensor) and returns the whole
        buffer: fixed shapes for a compiled or graph-captured decode step."""
        return FixedShapeWriter(self, positions)

    @property
    def nbytes(self) -> int:
        """Bytes actually allocated for keys and values (the whole preallocated buffer)."""
        return self.keys.nbytes + self.values.nbytes

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

    @property
    def device(self) -> torch.device:
        return self.keys.device


class FixedShapeWriter:
    """Writes new keys/values at `positions` (T,) and returns the whole preallocated
    buffers (batch, kv_heads, max_len, head_dim); used by `Transformer.decode_static`.

    A `KVWriter` only: the caller moves the cache's `length` on (notebook 01)."""

    def __init__(self, cache: StaticKVCache, positions: torch.Tensor):
        self.cache, self.positions = cache, positions

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys.index_copy_(2, self.positions, k)
        values.index_copy_(2, self.positions, v)
        return keys, values


def require_fitting_cache(cache, batch_size: int, needed: int, model) -> None:
    """Refuse, in one sentence, a cache passed in that cannot hold this generation: it must
    be a `KVCache`, empty, with `batch_size` rows of at least `needed` positions, and of the
    model's dtype and device where it says (notebook 01)."""
    if not isinstance(cache, KVCache):
        raise LabError(f"cache must be a KV cache with batch_size, max_len, length, update, advance and "
                       f"truncate (a StaticKVCache, say), got {type(cache).__name__!r}.")
    if cache.batch_size != batch_size:
        raise LabError(f"The cache has {cache.batch_size} rows and this generation has {batch_size}; "
                       f"pass a cache with batch_size={batch_size}.")
    if cache.max_len < needed:
        raise LabError(f"The cache holds {cache.max_len} positions and this generation needs {needed} "
                       f"(prompt + max_new_tokens); pass a longer cache.")
    if cache.length != 0:
        raise LabError(f"The cache already holds {cache.length} positions; pass an empty one "
                       f"(cache.truncate(0) empties it).")
    dtype, device = getattr(cache, "dtype", model.dtype), getattr(cache, "device", model.device)
    if dtype != model.dtype or torch.device(device) != model.device:
        raise LabError(f"The cache holds {dtype} on {device} and the model computes in {model.dtype} on "
                       f"{model.device}; make the cache with the model's dtype and device.")
