"""A paged KV cache, and attention that reads through block tables.

Introduced in notebook 06 (continuous batching).

All keys and values live in one pool of `num_blocks` blocks of `block_size`
positions per layer. Position p of a sequence is stored at pool slot

    slot = block_table[p // block_size] * block_size + p % block_size

A forward pass gets a `PagedView`, which the `Transformer` uses exactly like the
static cache of notebook 01 (`update(layer, k, v)` returns every key and value the
new tokens may attend to: the `KVWriter` protocol of kv_cache.py). The view scatters the new keys/values into their slots
and gathers each row's whole context back through its block table, padded to the
longest row; a key mask hides the padding. Production engines fuse the gather
into the attention kernel (PagedAttention); here it is a plain index, so that the
logits can be checked against the contiguous cache (they are equal: tested).

One extra block at the end of the pool is scratch space: rows that only pad a
batch (static batching keeps finished rows in the batch) write there.

What of the `KVCache` protocol the paged side implements, and why:

* `PagedKVCache` is the pool, not a cache: it holds many sequences, each at its
  own length, so it has no single `length` to advance or truncate.
* `PagedView` (one forward pass of the serving engine) is a `KVWriter` only: its
  rows are at different lengths, so `length`, `advance` and `truncate` have no
  single meaning; the model runner keeps each sequence's `num_cached` instead.
* `PagedRows` (`PagedKVCache.rows`) is a full `KVCache` over pages: rows that share
  one length (as `generate`'s left-padded batches do), so `generate` and
  `speculative_generate` can run on the paged cache. Its block tables are fixed
  when it is made (no growing on demand: that is the block manager's job in the
  engine), and `truncate` forgets positions without freeing blocks.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from ..kv_cache import FilledLength, kv_cache_bytes
from ..models.config import ModelConfig


class PagedKVCache:
    """The block pool: keys and values of shape (num_layers, num_slots, kv_heads, head_dim),
    num_slots = (num_blocks + 1) * block_size (the last block is scratch).
    Notebook 06 (continuous batching)."""

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

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

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

    def rows(self, tables) -> "PagedRows":
        """A `KVCache` for rows that share one length, stored through `tables`: (B, blocks)
        block ids (a tensor or a list of equal-length lists), one row per sequence."""
        return PagedRows(self, tables)


class PagedView:
    """What `Transformer` calls during one forward pass over a paged cache: a `KVWriter`
    (kv_cache.py) only, since its rows are at different lengths. Notebook 06."""

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


class PagedRows(FilledLength):
    """The paged pool as a `KVCache` (kv_cache.py): `batch_size` rows sharing one `length`,
    each stored through its own block table. Notebook 06 (continuous batching).

    tables: (B, blocks) block ids, each below `num_blocks`; a row holds
    max_len = blocks * block_size positions. The tables are fixed: a row cannot grow
    past them, and `truncate` does not free blocks (the block manager owns them).
    """

    def __init__(self, pool: PagedKVCache, tables):
        tables = torch.as_tensor(tables, dtype=torch.long, device=pool.device)
        if tables.dim() != 2 or tables.numel() == 0:
            raise LabError("tables must be one non-empty list of block ids per row, all of the same length.")
        if int(tables.min()) < 0 or int(tables.max()) >= pool.num_blocks:
            raise LabError(f"A block table names a block outside the pool's 0..{pool.num_blocks - 1}; "
                           "take block ids from the pool's block manager.")
        self.pool, self.tables = pool, tables
        self.batch_size = tables.shape[0]
        self.max_len = tables.shape[1] * pool.block_size
        self.length = 0
        self._view, self._view_span = None, None

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, kv_heads, T, D) at positions [length, length + T) of every row;
        return positions [0, length + T), each (B, kv_heads, length + T, D)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise LabError(f"These block tables hold {self.max_len} positions and this step needs {end}; "
                           "give each row more blocks or generate fewer tokens.")
        if self._view_span != (start, end):               # one view per forward pass, for every layer
            positions = torch.arange(start, end, device=self.device).expand(self.batch_size, end - start)
            context = None if start == 0 else torch.full((self.batch_size,), end, device=self.device)
            self._view, self._view_span = self.pool.view(self.tables, positions, context), (start, end)
        return self._view.update(layer, k, v)

