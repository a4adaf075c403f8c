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
The other way, `over_pool`, skips the copy: attention runs over the pool's used
slots in place, with a mask that shows each row only its own slots (equal logits:
tested; which one is faster is measured by decode_cost.py).

One extra block at the end of the pool is scratch space: rows that only pad a
batch (static batching keeps finished rows in the batch) write there.

What of the `KVCache` protocol the paged side implements, and why:

* `PagedKVCache` is the pool, not a cache: it holds many sequences, each at its
  own length, so it has no single `length` to advance or truncate.
* `PagedView` (one forward pass of the serving engine) is a `KVWriter` only: its
  rows are at different lengths, so `length`, `advance` and `truncate` have no
  single meaning; the scheduler keeps each sequence's `num_cached` instead. (The tests
  run the whole `KVCache` protocol over the pool too: tests/paged_rows.py.)
"""

from __future__ import annotations

import torch

from ...errors import LabError
from ...inputs import whole_number
from .block_manager import require_block_size
from ..kv_cache import kv_cache_bytes
from ..config import ModelConfig


class PagedKVCache:
    """The block pool: keys and values of shape (num_layers, num_slots, kv_heads, head_dim),
    num_slots = (num_blocks + 1) * block_size (the last block is scratch).
    Notebook 06 (continuous batching)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 device="cpu", dtype: torch.dtype = torch.float32):
        num_blocks = whole_number(num_blocks, "num_blocks (blocks in the paged cache)")
        self.num_blocks, self.block_size = num_blocks, require_block_size(block_size)
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
             context_lengths: torch.Tensor | int | None, over_pool: bool = False,
             reader: type | None = None) -> "PagedView":
        """The cache as one forward pass sees it.

        tables: (B, max_blocks) each row's block table, padded with the scratch block;
        new_positions: (B, T) positions of the tokens this pass writes;
        context_lengths: (B,) how many positions each row attends to after writing,
            or None when the new tokens are the whole context (a prefill from position 0),
            or an int: every row reads that many positions, its mask hiding those past its own
            (a fixed shape that never waits for the device: the decode graphs' reads);
        over_pool: attend over the pool itself (no gather; `PagedView.pool_mask` then
            turns a mask over each row's positions into one over pool slots);
        reader: the view class, `PagedView` or a subclass (the runner's, chosen once: the lab
            passes one that times its gathers).
        """
        reader = reader or PagedView
        write_slots = self.slots(tables, new_positions).reshape(-1)               # (B*T,)
        if context_lengths is None:
            return reader(self, write_slots)
        if isinstance(context_lengths, int) and over_pool:
            raise LabError("A fixed read width (an int context_lengths) reads by gathering; over_pool needs "
                           "each row's context length as a tensor.")
        longest = context_lengths if isinstance(context_lengths, int) else int(context_lengths.max())
        read_blocks = tables[:, : -(-longest // self.block_size)]                  # (B, W) blocks to read
        view = reader(self, write_slots, read_blocks, longest)
        if over_pool:
            positions = torch.arange(longest, device=tables.device).expand(len(tables), longest)
            view.read_over_pool(self.slots(tables, positions), positions < context_lengths[:, None])
        return view

    def packed_view(self, tables: torch.Tensor, token_rows: torch.Tensor, new_positions: torch.Tensor,
                    context_lengths: torch.Tensor, over_pool: bool = False, reader: type | None = None) -> "PagedView":
        """The cache for chunks of different lengths packed into one row of N tokens: token i
        belongs to row token_rows[i] and sits at new_positions[i] (both (N,)); tables: (B, W),
        W blocks per row, enough for context_lengths (B,). Every row's W blocks are read side
        by side: keys (1, kv_heads, B * W * block_size, D), as `masks.packed_mask` expects."""
        blocks = tables[token_rows, new_positions // self.block_size]              # (N,)
        write_slots = blocks * self.block_size + new_positions % self.block_size    # (N,)
        width = tables.shape[1] * self.block_size
        view = (reader or PagedView)(self, write_slots, tables, width, packed=True)
        if over_pool:
            offsets = torch.arange(self.block_size, device=tables.device)
            slots = (tables[:, :, None] * self.block_size + offsets).reshape(1, -1)  # (1, B*W*block_size)
            positions = torch.arange(width, device=tables.device).expand(len(tables), width)
            view.read_over_pool(slots, (positions < context_lengths[:, None]).reshape(1, -1))
        return view


class PagedView:
    """What `Transformer` calls during one forward pass over a paged cache: a `KVWriter`
    (kv_cache.py) only, since its rows are at different lengths. Notebook 06.

    Two ways to read: `gather` copies each row's context out of the pool through its
    block table, whole blocks at a time (the default); after `read_over_pool` attention
    runs over pool slots [0, span) in place, with a mask (`pool_mask`) that shows each
    row only its own slots. packed: the rows' contexts are read side by side into one
    row (chunks of different lengths packed together, `PagedKVCache.packed_view`).
    """

    def __init__(self, cache: PagedKVCache, write_slots: torch.Tensor, read_blocks: torch.Tensor | None = None,
                 context: int = 0, packed: bool = False):
        self.cache, self.write_slots = cache, write_slots
        self.read_blocks, self.context = read_blocks, context       # (B, W) blocks; S positions per row
        self.packed = packed
        self.read_slots, self.span = None, 0                        # set by `read_over_pool`
        self.decode_lengths = None                                  # set by `one_token_per_row`

    def one_token_per_row(self, context_lengths: torch.Tensor) -> None:
        """Mark this pass as one new token per row whose only mask is each row's context length
        (B,) (no window, no padding inside a row): a CPU decode step then runs each layer in one C++
        call that reads the pool through the block tables (`fused.decode_block`, notebook 00)."""
        self.decode_lengths = context_lengths.contiguous()
        self.read_blocks = self.read_blocks.contiguous()          # (B, W): the C++ call reads it row by row

    def read_over_pool(self, read_slots: torch.Tensor, readable: torch.Tensor) -> None:
        """Attend over the pool instead of gathering: read_slots (R, S) the slot of each key
        the mask will index, readable (R, S) True where a row may read it."""
        self.read_slots = read_slots
        self.span = int(read_slots[readable].max()) + 1

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, kv_heads, T, D) in their slots; return the keys and values
        to attend to, (B or 1, kv_heads, S, D)."""
        self.write(layer, k, v)
        if self.read_blocks is None:
            return k, v                                   # a fresh prefill attends to itself only
        return self.over_pool(layer) if self.span else self.gather(layer)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scatter the new keys and values (B, kv_heads, T, D) into their pool slots."""
        batch, kv_heads, T, head_dim = k.shape
        for pool, new in ((self.cache.keys[layer], k), (self.cache.values[layer], v)):
            flat = new.transpose(1, 2).reshape(batch * T, kv_heads, head_dim)  # (B*T, kv_heads, D)
            pool.index_copy_(0, self.write_slots, flat)

    def gather(self, layer: int):
        """Each row's first S positions, copied out of the pool one whole block at a time:
        (B, kv_heads, S, D) keys and values."""
        batch, width = self.read_blocks.shape
        block_ids = self.read_blocks.reshape(-1)                                  # (B*W,)
        out = []
        for pool in (self.cache.keys[layer], self.cache.values[layer]):          # (slots, kv_heads, D)
            blocks = pool.view(-1, self.cache.block_size, *pool.shape[1:])        # (blocks, block_size, kv_heads, D)
            rows = blocks.index_select(0, block_ids).view(batch, width * self.cache.block_size, *pool.shape[1:])
            rows = rows[:, : self.context]                                        # (B, S, kv_heads, D)
            if self.packed:
                rows = rows.reshape(1, -1, *pool.shape[1:])                       # (1, B*S, kv_heads, D)
            out.append(rows.transpose(1, 2))                                      # (B or 1, kv_heads, S, D)
        return tuple(out)

    def over_pool(self, layer: int):
        """Pool slots [0, span) as keys and values for every row, without a copy: (1, kv_heads, span, D)."""
        keys = self.cache.keys[layer][: self.span]         # (span, kv_heads, D)
        values = self.cache.values[layer][: self.span]
        return keys[None].transpose(1, 2), values[None].transpose(1, 2)   # (1, kv_heads, span, D)

    def pool_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A mask over the keys `read_slots` names, (R, 1, T, S), moved onto pool slots:
        (R, 1, T, span). A slot outside every row's context stays hidden."""
        batch, _, T, S = mask.shape
        slots = self.read_slots[:, None, None, :S].expand(batch, 1, T, S)                 # (B, 1, T, S)
        seen = torch.zeros(batch, 1, T, max(self.span, int(self.read_slots.max()) + 1),
                           dtype=torch.uint8, device=mask.device)
        seen.scatter_reduce_(3, slots, mask.to(torch.uint8), reduce="amax")            # padding slots: any True wins
        return seen[..., : self.span].bool()

