"""The paged pool as a `KVCache` (engine/kv_cache.py): a test fixture, so that the protocol's tests
and `generate` can run through the pool's block tables. (It lived in the engine, used by tests
only; issue 39 moved it here.)"""

import torch

from labsupport.engine.kv_cache import FilledLength
from labsupport.engine.serving.paged_cache import PagedKVCache
from labsupport.errors import LabError



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

    @property
    def num_layers(self) -> int:
        return self.pool.keys.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.pool.keys.shape[2]

    @property
    def head_dim(self) -> int:
        return self.pool.keys.shape[3]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        """Store k, v (B, kv_heads, T, D) at positions [start, start + T) of every row (reserved
        by `reserve`, kv_cache.py); return positions [0, start + T), each (B, kv_heads, start + T, D)."""
        end = start + k.shape[2]
        if self._view_span != (start, end):               # one view per forward pass, for every layer
            positions = torch.arange(start, end, device=self.device).expand(self.batch_size, end - start)
            context = None if start == 0 else torch.full((self.batch_size,), end, device=self.device)
            self._view, self._view_span = self.pool.view(self.tables, positions, context), (start, end)
        return self._view.update(layer, k, v)
