"""The block manager: which fixed-size cache blocks belong to which sequence.

Introduced in notebook 06 (continuous batching).

Reserving `max_length` positions per batch slot wastes most of the cache: a
request that stops after 20 tokens still holds room for 2,000. A paged cache
(vLLM's PagedAttention, Kwon et al. 2023) cuts the cache into blocks of
`block_size` positions and gives a sequence a new block only when it fills the
last one. Each sequence keeps a *block table*: its i-th block holds its
positions [i * block_size, (i + 1) * block_size). Blocks need not be adjacent,
so memory never fragments, and a finished sequence's blocks go straight back to
the free pool.

The tables live twice: as Python lists (`tables`, easy to read) and as one tensor
on the model's device (`table_tensor`, one row per sequence that holds blocks),
updated in place when a sequence grows, so that a forward pass picks its rows with
one index instead of rebuilding a tensor from lists every step.

With prefix caching (prefix_cache.py) a full prompt block can sit in several tables
at once; it is then counted, never written, and when no table holds it any more it
stays cached until its room is needed. Every block is always exactly one of: free,
owned by sequences, or cached and held by no one.
"""

from __future__ import annotations

import torch

from ...errors import LabError
from ...inputs import whole_number
from ..hardware import pick_device
from .prefix_cache import PrefixCache


def blocks_needed(num_positions: int, block_size: int) -> int:
    """Blocks that hold `num_positions` positions: the ceiling of num_positions / block_size.
    Notebook 06 (continuous batching)."""
    return -(-num_positions // block_size)


def require_block_size(block_size) -> int:
    """`block_size` as an int, if it is a whole number >= 1; else one sentence. The one check of
    it, at each entrance that takes one: `Engine`, `BlockManager`, `PagedKVCache`. Notebook 06."""
    return whole_number(block_size, "block_size (positions per cache block)")


class BlockManager:
    """Hands out blocks 0 .. num_blocks - 1 and keeps each sequence's block table;
    prefix_caching=True shares full prompt blocks between sequences (prefix_cache.py).
    Block id `num_blocks` is the paged cache's scratch block, which pads short table rows.
    Notebook 06 (continuous batching)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False, device="cpu"):
        num_blocks = whole_number(num_blocks, "num_blocks (blocks in the paged cache)")
        block_size = require_block_size(block_size)
        if not isinstance(prefix_caching, bool):
            raise LabError(f"prefix_caching must be True or False, got {prefix_caching!r}.")
        device = pick_device(device)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0 first
        self.tables: dict[int, list[int]] = {}                              # sequence index -> blocks
        self.prefix_cache = PrefixCache(block_size) if prefix_caching else None
        self.peak_used = 0
        # row 0 is all scratch (padding rows); a sequence holding blocks gets its own row
        self.table_tensor = torch.full((9, num_blocks), num_blocks, dtype=torch.long, device=device)
        self.row_of: dict[int, int] = {}
        self.free_rows = list(range(8, 0, -1))

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now: free ones, and cached ones no sequence holds."""
        evictable = self.prefix_cache.num_evictable if self.prefix_cache else 0
        return len(self.free_blocks) + evictable

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.num_free

    def table(self, seq_index: int) -> list[int]:
        return self.tables.get(seq_index, [])

    def extra_blocks(self, seq_index: int, num_positions: int) -> int:
        """How many more blocks a sequence needs to hold `num_positions` positions."""
        return max(0, blocks_needed(num_positions, self.block_size) - len(self.table(seq_index)))

    def can_grow(self, seq_index: int, num_positions: int) -> bool:
        return self.extra_blocks(seq_index, num_positions) <= self.num_free

    def grow(self, seq_index: int, num_positions: int) -> None:
        """Give a sequence enough blocks for `num_positions` positions (call `can_grow` first)."""
        seq_index = whole_number(seq_index, "seq_index (the sequence's number)", minimum=0)
        num_positions = whole_number(num_positions, "num_positions (positions the sequence holds)", minimum=0)
        extra = self.extra_blocks(seq_index, num_positions)
        if extra > self.num_free:
            raise LabError(f"Sequence {seq_index} needs {extra} more cache blocks and only "
                           f"{self.num_free} are free; the scheduler should have preempted first.")
        self._append(seq_index, [self._take() for _ in range(extra)])

    def _take(self) -> int:
        """A free block, or else the least recently used cached block no one holds."""
        return self.free_blocks.pop() if self.free_blocks else self.prefix_cache.evict()

    def _append(self, seq_index: int, blocks: list[int]) -> None:
        """Add blocks to a table: the list, and the same entries of its tensor row, in place."""
        table = self.tables.setdefault(seq_index, [])
        if seq_index not in self.row_of:
            if not self.free_rows:                        # more sequences than rows: double the rows
                old = len(self.table_tensor)
                self.table_tensor = torch.cat([self.table_tensor, torch.full_like(self.table_tensor, self.num_blocks)])
                self.free_rows = list(range(2 * old - 1, old - 1, -1))
            self.row_of[seq_index] = self.free_rows.pop()
        if blocks:
            row = self.row_of[seq_index]
            self.table_tensor[row, len(table): len(table) + len(blocks)] = torch.tensor(blocks)
            table.extend(blocks)
        self.peak_used = max(self.peak_used, self.num_used)

    def table_rows(self, seq_indices: list[int], padding_rows: int = 0, width: int | None = None) -> torch.Tensor:
        """The block tables of these sequences (then `padding_rows` all-scratch rows) as one
        (B, width) tensor, picked from `table_tensor`; width: blocks per row (default: all)."""
        rows = [self.row_of.get(i, 0) for i in seq_indices] + [0] * padding_rows
        picked = torch.tensor(rows, device=self.table_tensor.device)
        return self.table_tensor[picked, :width]                                  # (B, width)

    def release(self, seq_index: int) -> None:
        """A sequence lets go of its blocks: cached ones lose a reference, the rest are free."""
        for block in reversed(self.tables.pop(seq_index, [])):
            if self.prefix_cache is not None and block in self.prefix_cache:
                self.prefix_cache.unref(block)
            else:
                self.free_blocks.append(block)
        row = self.row_of.pop(seq_index, None)
        if row is not None:
            self.table_tensor[row].fill_(self.num_blocks)
            self.free_rows.append(row)

    # --- prefix caching --------------------------------------------------------------

    def cached_prefix(self, tokens: list[int]) -> list[int]:
        """Cached blocks of the longest cached full-block prefix of `tokens`, leaving at least
        the last token to compute (its logits give the next token)."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.lookup(tokens[:-1])

    def admit_cost(self, tokens: list[int], num_positions: int) -> int:
        """Blocks a new sequence takes from `num_free` to hold `num_positions`, reusing its cached prefix."""
        hits = self.cached_prefix(tokens)
        newly_held = sum(self.prefix_cache.refs[b] == 0 for b in hits) if hits else 0
        return blocks_needed(num_positions, self.block_size) - len(hits) + newly_held

    def admit(self, seq_index: int, tokens: list[int], num_positions: int) -> int:
        """Give a new sequence its cached prefix blocks and new blocks up to `num_positions`
        (check `admit_cost` against `num_free` first); returns the positions already cached."""
        if seq_index in self.tables:
            raise LabError(f"Sequence {seq_index} already holds blocks; release it before admitting it again.")
        hits = self.cached_prefix(tokens)
        for block in hits:
            self.prefix_cache.ref(block)
        self._append(seq_index, hits)
        self.grow(seq_index, num_positions)
        return len(hits) * self.block_size

    def cache_full_blocks(self, seq_index: int, prompt: list[int], num_cached: int) -> None:
        """Name the sequence's full prompt blocks computed so far, so that others can share them."""
        if self.prefix_cache is None:
            return
        held = len(self.table(seq_index)) * self.block_size
        num_cached = whole_number(num_cached, f"num_cached (computed positions: at most the {held} the sequence's "
                                  f"blocks hold)", minimum=0, maximum=held)
        self.prefix_cache.insert(prompt[: num_cached], self.table(seq_index))

    def read_only_blocks(self) -> set[int]:
        """Blocks whose positions are final (cached): no forward pass may write them."""
        return set(self.prefix_cache.hash_of) if self.prefix_cache else set()

    def assert_no_leaks(self) -> None:
        """Raise unless every block is exactly one of free, cached and held by no one, or owned,
        reference counts match the tables, and no sequence owns any (tests call this at the end)."""
        cached = self.prefix_cache
        idle = list(cached.unused) if cached else []
        holders = [b for table in self.tables.values() for b in table]
        owned = sorted(set(holders))
        if sorted(idle + self.free_blocks + owned) != list(range(self.num_blocks)):
            raise AssertionError(f"Block accounting is broken: owned {owned}, free {self.free_blocks}, "
                                 f"cached unused {idle}.")
        counts = {b: holders.count(b) for b in owned}
        if cached and any(cached.refs[b] != counts.get(b, 0) for b in cached.refs):
            raise AssertionError(f"Reference counts {cached.refs} do not match the tables {self.tables}.")
        if any(n > 1 and not (cached and b in cached) for b, n in counts.items()):
            raise AssertionError("A block that is not in the prefix cache is shared.")
        if owned:
            raise AssertionError(f"{len(owned)} blocks still owned by sequences {list(self.tables)}.")
        if self.row_of or (self.table_tensor[1:] != self.num_blocks).any():
            raise AssertionError("A block-table row is still in use after every sequence left.")
