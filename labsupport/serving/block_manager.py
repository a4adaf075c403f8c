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
"""

from __future__ import annotations

from ..errors import LabError


def blocks_needed(num_positions: int, block_size: int) -> int:
    """Blocks that hold `num_positions` positions: the ceiling of num_positions / block_size.
    Notebook 06 (continuous batching)."""
    return -(-num_positions // block_size)


class BlockManager:
    """Hands out blocks 0 .. num_blocks - 1 and keeps each sequence's block table.
    Notebook 06 (continuous batching)."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise LabError(f"The cache needs at least one block, got num_blocks={num_blocks}.")
        if block_size < 1:
            raise LabError(f"block_size must be at least 1, got {block_size}.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0 first
        self.tables: dict[int, list[int]] = {}                              # sequence index -> blocks
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
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
        extra = self.extra_blocks(seq_index, num_positions)
        if extra > self.num_free:
            raise LabError(f"Sequence {seq_index} needs {extra} more cache blocks and only "
                           f"{self.num_free} are free; the scheduler should have preempted first.")
        table = self.tables.setdefault(seq_index, [])
        table.extend(self.free_blocks.pop() for _ in range(extra))
        self.peak_used = max(self.peak_used, self.num_used)

    def release(self, seq_index: int) -> None:
        """Return every block of a sequence to the free pool."""
        self.free_blocks.extend(reversed(self.tables.pop(seq_index, [])))

    def assert_no_leaks(self) -> None:
        """Raise if any block is still owned or appears twice (tests call this at the end)."""
        owned = [b for table in self.tables.values() for b in table]
        if len(set(owned) | set(self.free_blocks)) != self.num_blocks or \
                len(owned) + len(self.free_blocks) != self.num_blocks:
            raise AssertionError(f"Block accounting is broken: owned {owned}, free {self.free_blocks}.")
        if owned:
            raise AssertionError(f"{len(owned)} blocks still owned by sequences {list(self.tables)}.")
