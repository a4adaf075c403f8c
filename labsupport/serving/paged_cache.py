"""A paged KV cache, and attention that reads through block tables.

Introduced in notebook 06 (continuous batching).

All keys and values live in one pool of `num_blocks` blocks of `block_size`
positions per layer. Position p of a sequence is stored at pool slot

    slot = block_table[p // block_size] * block_size + p % block_size

A forward pass gets a `PagedView`, which the `Transformer` uses exactly like the
static cache of notebook 01 (`update(layer, k, v)` returns every key and value the
new tokens may attend to). The view scatters the new keys/values into their slots
and gathers each row's whole context back through its block table, padded to the
longest row; a key mask hides the padding. Production engines fuse the gather
into the attention kernel (PagedAttention); here it is a plain index, so that the
logits can be checked against the contiguous cache (they are equal: tested).

One extra block at the end of the pool is scratch space: rows that only pad a
batch (static batching keeps finished rows in the batch) write there.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from ..kv_cache import kv_cache_bytes
from ..models.config import ModelConfig


class PagedKVCache:
    """The block pool: keys and values of shape (num_layers, num_slots, kv_heads, head_dim),
    num_slots = (num_blocks + 1) * block_size (the last block is scratch)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 device="cpu", dtype: torch.dtype = torch.float32):
        if num_blocks < 1 or block_size < 1:
            raise LabError(f"A paged cache needs num_blocks >= 1 and block_size >= 1, "
                           f"got {num_blocks} and {block_size}.")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        shape = (config.num_layers, (num_blocks + 1) * block_size, config.num_kv_heads, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.bytes_per_block = kv_cache_bytes(config, block_size, 1, dtype)

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool slot of each position: tables (B, max_blocks), positions (B, N) -> slots (B, N)."""
        block_index = torch.gather(tables, 1, positions // self.block_size)        # (B, N)
        return block_index * self.block_size + positions % self.block_size

    def view(self, tables: torch.Tensor, new_positions: torch.Tensor,
             context_lengths: torch.Tensor | None) -> "PagedView":
        """The cache as one forward pass sees it.

        tables: (B, max_blocks) each row's block table, padded with the scratch block;
        new_positions: (B, T) positions of the tokens this pass writes;
        context_lengths: (B,) how many positions each row attends to after writing,
            or None when the new tokens are the whole context (a prefill from position 0).
        """
        write_slots = self.slots(tables, new_positions).reshape(-1)               # (B*T,)
        read_slots = None
        if context_lengths is not None:
            longest = int(context_lengths.max())
            positions = torch.arange(longest, device=tables.device).expand(len(tables), longest)
            read_slots = self.slots(tables, positions)                              # (B, S)
        return PagedView(self, write_slots, read_slots)


class PagedView:
    """What `Transformer` calls during one forward pass over a paged cache."""

    def __init__(self, cache: PagedKVCache, write_slots: torch.Tensor, read_slots: torch.Tensor | None):
        self.cache, self.write_slots, self.read_slots = cache, write_slots, read_slots

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, kv_heads, T, D) in their slots; return the keys and values
        to attend to, (B, kv_heads, S, D)."""
        batch, kv_heads, T, head_dim = k.shape
        for pool, new in ((self.cache.keys[layer], k), (self.cache.values[layer], v)):
            flat = new.transpose(1, 2).reshape(batch * T, kv_heads, head_dim)  # (B*T, kv_heads, D)
            pool.index_copy_(0, self.write_slots, flat)
        if self.read_slots is None:
            return k, v                                   # a fresh prefill attends to itself only
        keys = self.cache.keys[layer][self.read_slots]    # (B, S, kv_heads, D)
        values = self.cache.values[layer][self.read_slots]
        return keys.transpose(1, 2), values.transpose(1, 2)   # (B, kv_heads, S, D)
