"""Checkers for notebook 01 (KV cache).

Introduced in notebook 01 (KV cache).

* `check_cache_update`: the learner stores one attention layer's new keys and
  values in preallocated buffers and returns everything cached so far;
* `check_cache_size`: the learner computes the bytes a KV cache needs.

Both compare with the package's reference (`StaticKVCache.update`,
`kv_cache_bytes`) and raise `CheckFailed` with a hint when they disagree.
"""

from __future__ import annotations

import torch

from ..kv_cache import StaticKVCache, kv_cache_bytes
from ..models.config import PRESETS, ModelConfig
from . import fail, passed

UPDATE = "cache update of one attention layer"
SIZE = "KV cache size"

# (batch, kv_heads, max_len, head_dim, length already cached, new tokens T)
UPDATE_CASES = [(1, 3, 16, 8, 0, 5), (1, 3, 16, 8, 5, 1), (2, 2, 12, 4, 7, 3), (1, 1, 8, 4, 7, 1)]


def _one_layer_cache(batch: int, kv_heads: int, max_len: int, head_dim: int) -> StaticKVCache:
    """A reference StaticKVCache with a single layer of the given shape."""
    config = ModelConfig(family="llama", vocab_size=8, hidden_size=kv_heads * head_dim, num_layers=1,
                         num_heads=kv_heads, num_kv_heads=kv_heads, intermediate_size=8,
                         max_position=max_len)
    return StaticKVCache(config, batch, max_len)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _check_one_update(fn, batch, kv_heads, max_len, head_dim, length, T, generator) -> None:
    reference = _one_layer_cache(batch, kv_heads, max_len, head_dim)
    # earlier tokens are already in the buffers; the rest holds zeros
    reference.keys[0, :, :, :length] = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    reference.values[0, :, :, :length] = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    reference.length = length
    key_buffer, value_buffer = reference.keys[0].clone(), reference.values[0].clone()
    new_k = torch.randn(batch, kv_heads, T, head_dim, generator=generator)   # (batch, kv_heads, T, head_dim)
    new_v = torch.randn(batch, kv_heads, T, head_dim, generator=generator)
    want_k, want_v = reference.update(0, new_k, new_v)                       # (batch, kv_heads, length+T, head_dim)
    case = f"(length={length}, T={T}, buffers {tuple(key_buffer.shape)})"

    out = fn(key_buffer, value_buffer, new_k.clone(), new_v.clone(), length)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        fail(UPDATE, "a pair (keys so far, values so far)", type(out).__name__,
             "end the function with `return keys, values`.")
    got_k, got_v = out
    if not isinstance(got_k, torch.Tensor) or got_k.shape != want_k.shape or got_v.shape != want_v.shape:
        fail(UPDATE, f"keys and values of shape {tuple(want_k.shape)} {case}",
             f"{_shape(got_k)} and {_shape(got_v)}",
             "return the buffers up to the end of the new tokens: buffer[:, :, :length + T]; "
             "the sequence is dimension 2.")
    if torch.equal(got_k, want_v) and torch.equal(got_v, want_k) and T > 0:
        fail(UPDATE, "keys first, then values", "them swapped", "return (keys, values) in that order.")
    if not torch.equal(key_buffer, reference.keys[0]) or not torch.equal(value_buffer, reference.values[0]):
        if torch.equal(got_k, want_k) and torch.equal(got_v, want_v):
            fail(UPDATE, f"the new keys/values written into the buffers {case}",
                 "the right result but unchanged buffers",
                 "store in place with slice assignment, key_buffer[:, :, start:end] = new_keys; "
                 "torch.cat makes a new tensor, so the next step would not find them.")
        if not torch.equal(key_buffer[:, :, :length], reference.keys[0, :, :, :length]):
            fail(UPDATE, f"the {length} tokens already cached left as they were {case}",
                 "them overwritten", "write only positions length .. length + T - 1.")
        written_at = [p for p in range(max_len - T + 1) if torch.equal(key_buffer[:, :, p:p + T], new_k)]
        fail(UPDATE, f"the new keys at positions {length}..{length + T - 1} {case}",
             f"them at position(s) {written_at}" if written_at else "other values there",
             "the first free position is `length`: key_buffer[:, :, length:length + T] = new_keys.")
    if not (torch.equal(got_k, want_k) and torch.equal(got_v, want_v)):
        fail(UPDATE, f"the returned keys/values to equal the buffers' first {length + T} positions {case}",
             "different values", "return key_buffer[:, :, :length + T] and value_buffer[:, :, :length + T].")


def check_cache_update(fn) -> None:
    """Check fn(key_buffer, value_buffer, new_keys, new_values, length) -> (keys, values).

    Introduced in notebook 01 (KV cache). Buffers are (batch, kv_heads, max_len,
    head_dim); new keys/values (batch, kv_heads, T, head_dim); `length` positions
    are already filled. fn must store the new ones at [length, length + T) in
    place and return keys and values of positions [0, length + T).
    """
    generator = torch.Generator().manual_seed(1)
    for case in UPDATE_CASES:
        _check_one_update(fn, *case, generator)
    passed(UPDATE, f"{len(UPDATE_CASES)} cases agree with StaticKVCache.update.")


BYTES_TO_DTYPE = {4: torch.float32, 2: torch.float16, 1: torch.int8}
SIZE_CASES = [("smollm2-135m", 1024, 1, 4), ("smollm2-135m", 512, 8, 2), ("gpt2", 1000, 2, 4),
              ("llama-7b-shape", 4096, 1, 2), ("tiny-llama", 7, 3, 1)]


def _size_hint(got, want: int, config: ModelConfig, batch: int, bytes_per_value: int) -> str:
    """Guess the usual slip from the ratio of the answer to the right one."""
    if not isinstance(got, (int, float)) or got <= 0:
        return "return a positive number of bytes (an int)."
    ratio = got / want
    guesses = [(0.5, "keys AND values are cached: multiply by 2."),
               (config.num_heads / config.num_kv_heads, "use num_kv_heads, not num_heads: with grouped-query "
                                                        "attention several query heads share one key/value head."),
               (1 / config.num_layers, "every layer has its own cache: multiply by num_layers."),
               (1 / bytes_per_value, "multiply by bytes_per_value to turn values into bytes."),
               (1 / batch, "every sequence of the batch has its own cache: multiply by batch."),
               (8.0, "the answer is in bytes, not bits."),
               (config.hidden_size / config.head_dim / config.num_kv_heads,
                "use num_kv_heads x head_dim per token and layer, not hidden_size.")]
    for expected_ratio, hint in guesses:
        if expected_ratio != 1 and abs(ratio - expected_ratio) < 1e-9 * max(1.0, expected_ratio):
            return hint
    return "layers x 2 (keys and values) x kv-heads x head-dim x length x batch x bytes per value."


def check_cache_size(fn) -> None:
    """Check fn(config, length, batch, bytes_per_value) -> bytes against kv_cache_bytes.

    Introduced in notebook 01 (KV cache).
    """
    for name, length, batch, bytes_per_value in SIZE_CASES:
        config = PRESETS[name]
        want = kv_cache_bytes(config, length, batch, BYTES_TO_DTYPE[bytes_per_value])
        got = fn(config, length, batch, bytes_per_value)
        if got != want:
            fail(SIZE, f"{want:,} bytes for {name} (length {length}, batch {batch}, "
                       f"{bytes_per_value} bytes per value)", f"{got!r}",
                 _size_hint(got, want, config, batch, bytes_per_value))
    passed(SIZE, f"{len(SIZE_CASES)} configurations agree with kv_cache_bytes.")
