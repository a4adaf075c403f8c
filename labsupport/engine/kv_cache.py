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
needs across passes: its shape, dtype and device, its fill level `length`, `reserve`
and `truncate`, and whether it offers fixed-shape writes (`fixed_shape_writes`, for a
compiled decode step). The length moves in one place only: `reserve(n)`, which a pass
calls before it writes (`Transformer.forward` on the eager path, the compiled decoder on
the compiled one), hands out the writer for the next n positions and moves the length on;
`truncate` rolls it back. `generate`, `speculative_generate` and the drafts take any
`KVCache` (default: a `StaticKVCache`), checked by `require_fitting_cache`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..errors import LabError
from ..inputs import whole_number
from .config import ModelConfig
from .hardware import bytes_per_value


def kv_cache_bytes(config: ModelConfig, length: int, batch_size: int = 1,
                   dtype: torch.dtype = torch.float32) -> int:
    """Bytes needed to cache `length` positions: layers x 2 (K and V) x kv-heads x head-dim
    (`ModelConfig.kv_values_per_token`) x length x batch x bytes. Notebook 01 (KV cache)."""
    return config.kv_values_per_token * length * batch_size * bytes_per_value(dtype)


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
class KVCache(Protocol):
    """A cache a generation loop can drive across forward passes (notebook 01): the
    extension point of `generate` and speculative decoding.

    * `batch_size`: rows; `max_len`: positions each row can hold; `num_layers`,
      `num_kv_heads`, `head_dim`: the model shape it stores; `dtype`, `device`: what its
      `update`s return (the model's);
    * `length`: positions filled so far, the same for every row, 0 <= length <= max_len;
    * `reserve(n, fixed_shape=False)`: the `KVWriter` of one pass of n new tokens, for
      positions [length, length + n): its `update` stores there and returns positions
      [0, length + n). It moves `length` on at once (the one place a length moves), and
      raises a LabError rather than go past `max_len`. With fixed_shape=True (only where
      `fixed_shape_writes` is True) the writer writes at a position *tensor* and returns the
      whole preallocated buffer: every step has the same shapes (compiled.py);
    * `truncate(length)`: forget every position from `length` on (speculative decoding's
      rollback; `truncate(0)` empties the cache).

    Implemented by `StaticKVCache` and the int8 cache (kv_quant.py, notebook 08); the
    tests run it over the paged pool too (tests/paged_rows.py).
    """

    batch_size: int
    max_len: int
    length: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    fixed_shape_writes: bool

    def reserve(self, n: int, fixed_shape: bool = False) -> KVWriter:
        ...

    def truncate(self, length: int) -> None:
        ...


class FilledLength:
    """The bookkeeping every `KVCache` here shares: `length` positions of every row are
    filled; `reserve` hands out one pass's writer and moves the length on, `truncate` rolls
    it back. A cache adds `write(layer, k, v, start)`: store at [start, start + T), return
    [0, start + T). Notebook 01 (KV cache); the rollback is notebook 05's (speculative decoding).
    """

    length: int = 0
    fixed_shape_writes: bool = False

    def reserve(self, n: int, fixed_shape: bool = False) -> KVWriter:
        """The writer of the next `n` positions; the cache now counts them as filled."""
        n = whole_number(n, "n (the positions one pass writes)")
        if fixed_shape and not self.fixed_shape_writes:
            raise LabError(f"This {type(self).__name__} has no fixed-shape writes; use a StaticKVCache "
                           f"for a compiled decode step.")
        start, end = self.length, self.length + n
        if end > self.max_len:
            raise LabError(f"The KV cache holds {self.max_len} positions and this step needs {end}; "
                           "make the cache longer (max_len) or generate fewer tokens.")
        self.length = end
        return self.fixed_shape_writer(start, n) if fixed_shape else PassWriter(self, start)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding's rollback)."""
        length = whole_number(length, "length (the positions to keep)", minimum=0)
        if length > self.length:
            raise LabError(f"Cannot truncate a cache of length {self.length} to {length}: it can only "
                           f"forget positions, so give at most {self.length}.")
        self.length = length


class PassWriter:
    """The `KVWriter` that `reserve` hands one pass: each layer's `update` stores at the
    positions reserved, [start, start + T), through the cache's `write`. Notebook 01 (KV cache)."""

    def __init__(self, cache: FilledLength, start: int):
        self.cache, self.start = cache, start

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        return self.cache.write(layer, k, v, self.start)


class LayerBuffers:
    """What a cache with one keys buffer of shape (layers, batch, kv_heads, max_len, head_dim)
    declares of itself from that buffer: `num_layers`, `num_kv_heads`, `head_dim`, `device`
    (`StaticKVCache`, and notebook 08's `Int8KVCache`). Notebook 01 (KV cache)."""

    keys: torch.Tensor

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
    def device(self) -> torch.device:
        return self.keys.device


class StaticKVCache(LayerBuffers, FilledLength):
    """Preallocated keys and values for every layer of a model: the `KVCache` of
    notebook 01 (KV cache), with fixed-shape writes for a compiled step.

    Storage: ``keys`` and ``values`` of shape
    (num_layers, batch_size, num_kv_heads, max_len, head_dim).
    ``length`` positions (the same for every row) are filled.
    """

    fixed_shape_writes = True

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        batch_size = whole_number(batch_size, "batch_size")
        max_len = whole_number(max_len, "max_len")
        if max_len > config.max_position:
            raise LabError(
                f"A cache of {max_len} positions is longer than the model's context of "
                f"{config.max_position} tokens; shorten the prompt or max_new_tokens."
            )
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # one view per layer, each (batch, kv_heads, max_len, head_dim): a write selects no layer
        self.layer_keys = [self.keys[i] for i in range(config.num_layers)]
        self.layer_values = [self.values[i] for i in range(config.num_layers)]
        self.layer_ids = torch.arange(config.num_layers, device=device)     # the fixed-shape writer's index
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "StaticKVCache":
        """A cache with `model`'s config, device and dtype: the default cache of `generate`
        and the default `cache_factory` of a speculative draft (notebooks 01 and 05)."""
        return cls(model.config, batch_size, max_len, device=model.device, dtype=model.dtype)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        """Store one layer's new keys/values (batch, kv_heads, T, head_dim) at positions
        [start, start + T) and return all keys/values so far, each (batch, kv_heads, start + T, head_dim).
        A pass may bring fewer rows than the cache holds: it fills the first `batch` rows (the prefill
        of a batch in a compiled decoder's cache, whose rows are rounded up to a bucket: compiled.py)."""
        end, rows = start + k.shape[2], k.shape[0]
        keys, values = self.layer_keys[layer][:rows], self.layer_values[layer][:rows]   # views of keys[layer], ...
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def fixed_shape_writer(self, start: int, n: int) -> "FixedShapeWriter":
        """The writer of positions [start, start + n) as a tensor, returning the whole buffer
        (what `reserve(n, fixed_shape=True)` hands out)."""
        return FixedShapeWriter(self.keys, self.values, self.layer_ids,
                                torch.arange(start, start + n, device=self.device))

    @property
    def nbytes(self) -> int:
        """Bytes actually allocated for keys and values (the whole preallocated buffer)."""
        return self.keys.nbytes + self.values.nbytes

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype



class FixedShapeWriter:
    """Writes new keys/values at `positions` (T,), a tensor, and returns the whole
    preallocated buffers (batch, kv_heads, max_len, head_dim): the same shapes at every
    step, so a compiled step and its CUDA graph replay (compiled.py; the mask hides the
    slots not written yet). A `KVWriter` only: `reserve` has already moved the length on.
    Notebook 01 (KV cache).

    Each write is one `index_put_` on the whole (layers, ...) buffer, indexed by a layer
    tensor and the positions, not a copy into a per-layer view: torch.compile then updates
    the buffer in place, where a write into a view of it made inductor copy the buffer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, layers: torch.Tensor, positions: torch.Tensor):
        self.keys, self.values, self.layers, self.positions = keys, values, layers, positions

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        # the layer as a slice of an index tensor made with the cache (no tensor made inside the step)
        at = (self.layers[layer: layer + 1], slice(None), slice(None), self.positions)
        self.keys[at] = k.permute(2, 0, 1, 3)                  # (T, B, kv_heads, D): indexed dims first
        self.values[at] = v.permute(2, 0, 1, 3)
        return self.keys[layer], self.values[layer]             # (B, kv_heads, max_len, D)


def require_fitting_cache(cache, batch_size: int, needed: int, model) -> None:
    """Refuse, in one sentence, a cache passed in that cannot hold this generation: it must
    be a `KVCache`, empty, with `batch_size` rows of at least `needed` positions, shaped for
    the model (layers, key/value heads, head size), and of the model's dtype and device
    (notebook 01)."""
    if not isinstance(cache, KVCache):
        raise LabError(f"cache must be a KV cache with batch_size, max_len, length, num_layers, num_kv_heads, "
                       f"head_dim, dtype, device, fixed_shape_writes, reserve and truncate (a StaticKVCache, "
                       f"say), got {type(cache).__name__!r}.")
    config = model.config
    shape, model_shape = ((cache.num_layers, cache.num_kv_heads, cache.head_dim),
                          (config.num_layers, config.num_kv_heads, config.head_dim))
    if shape != model_shape:
        raise LabError(f"The cache holds {shape[0]} layers of {shape[1]} key/value heads of {shape[2]} numbers and "
                       f"this model has {model_shape[0]} layers of {model_shape[1]} of {model_shape[2]}; make the "
                       f"cache for this model (StaticKVCache.for_model(model, ...)).")
    if cache.batch_size != batch_size:
        raise LabError(f"The cache has {cache.batch_size} rows and this generation has {batch_size}; "
                       f"pass a cache with batch_size={batch_size}.")
    if cache.max_len < needed:
        raise LabError(f"The cache holds {cache.max_len} positions and this generation needs {needed} "
                       f"(prompt + max_new_tokens); pass a longer cache.")
    if cache.length != 0:
        raise LabError(f"The cache already holds {cache.length} positions; pass an empty one "
                       f"(cache.truncate(0) empties it).")
    if cache.dtype != model.dtype or torch.device(cache.device) != model.device:
        raise LabError(f"The cache holds {cache.dtype} on {cache.device} and the model computes in {model.dtype} "
                       f"on {model.device}; make the cache with the model's dtype and device.")
