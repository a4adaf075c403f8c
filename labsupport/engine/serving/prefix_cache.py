"""Prefix caching: blocks of keys and values that several requests share.

Introduced in notebook 06b (chunked prefill and prefix caching).

Chat requests start with the same system prompt, so their first cache blocks hold
the same keys and values. A prefix cache (vLLM's automatic prefix caching, SGLang's
RadixAttention) computes such a block once and lets every later request point its
block table at it:

* a FULL block of prompt tokens is named by `block_hash(parent_hash, tokens)`: a hash
  of its tokens and of the hash of the block before it, so the same tokens after a
  different prefix get a different name (their keys differ: attention saw another past);
* a name is only where to look: 64 bits can collide (two prefixes, one name), so a block
  found by name is used only if the tokens it was computed from are the new prompt's,
  compared one by one, as any hash table compares keys. A collision costs a recomputed
  block, never another prompt's keys and values;
* a block in the cache has a reference count: how many sequences' tables hold it. It is
  never written again: its positions are final;
* a block that no sequence holds stays cached, in case another request needs it, until
  its room is needed: then the least recently used one is evicted (forgotten, and given
  out as a free block).

The block manager (block_manager.py) owns blocks; this cache only names them and counts
who shares them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

from ...errors import LabError


def block_hash(parent_hash: int | None, block_tokens: Sequence[int]) -> int:
    """The name of a full block: a stable 64-bit hash of the hash of the block before it
    (None for a sequence's first block) and of the block's token ids, so that a block's
    name stands for its whole prefix. hashlib, not Python's salted `hash`: the same
    tokens give the same name in every process. Two prefixes may still share a name, so
    `PrefixCache.lookup` compares tokens too. Introduced in notebook 06b (chunked prefill and prefix caching)."""
    text = f"{'-' if parent_hash is None else int(parent_hash)}|{','.join(str(int(t)) for t in block_tokens)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def prefix_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """The chained hashes of every full block of `tokens`, first block first.
    Notebook 06 (continuous batching)."""
    hashes, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start: start + block_size])
        hashes.append(parent)
    return hashes


class PrefixCache:
    """hash -> block id for full prompt blocks of `block_size` positions, each block checked
    against the tokens it was computed from, with reference counts and LRU eviction of the
    blocks no sequence holds. Notebook 06 (continuous batching)."""

    def __init__(self, block_size: int):
        assert isinstance(block_size, int) and block_size >= 1, "made by a BlockManager, which checks block_size"
        self.block_size = block_size
        self.block_of: dict[int, int] = {}          # hash -> block id
        self.hash_of: dict[int, int] = {}           # block id -> hash
        # block id -> (tokens, end): it holds the keys/values of tokens[end - block_size: end],
        # computed after tokens[:end - block_size] (one tuple shared by a sequence's blocks)
        self.source_of: dict[int, tuple[tuple[int, ...], int]] = {}
        self.refs: dict[int, int] = {}              # block id -> sequences holding it
        self.unused: OrderedDict[int, None] = OrderedDict()   # held by no one, least recently used first
        self.evictions = 0

    def __contains__(self, block: int) -> bool:
        return block in self.hash_of

    @property
    def num_evictable(self) -> int:
        """Cached blocks no sequence holds: free room, once evicted."""
        return len(self.unused)

    def lookup(self, tokens: Sequence[int]) -> list[int]:
        """The cached blocks of the longest full-block prefix of `tokens`: found by name, kept
        only while they were computed from these very tokens (stops at the first miss)."""
        tokens = tuple(tokens)
        blocks, checked, checked_end = [], None, 0          # tokens[:checked_end] equal `checked`'s
        ends = range(self.block_size, len(tokens) + 1, self.block_size)
        for h, end in zip(prefix_block_hashes(tokens, self.block_size), ends):
            block = self.block_of.get(h)
            if block is None:
                break
            source, source_end = self.source_of[block]
            start = checked_end if source is checked else 0
            if source_end != end or source[start:end] != tokens[start:end]:
                break                                       # the name collides: another prefix's keys
            blocks.append(block)
            checked, checked_end = source, end
        return blocks

    def insert(self, tokens: Sequence[int], table: Sequence[int]) -> int:
        """Name the full blocks of `tokens` (a prompt's computed part), block i held in table[i]
        by the one sequence that wrote it, unless already named; returns how many got a name.
        A block whose name another block has keeps no name (its sequence keeps its own copy)."""
        tokens, named = tuple(tokens), 0
        if len(table) < len(tokens) // self.block_size:
            raise LabError(f"{len(tokens)} tokens fill {len(tokens) // self.block_size} blocks but the table holds "
                           f"only {len(table)}; name only positions the sequence's blocks hold.")
        for i, h in enumerate(prefix_block_hashes(tokens, self.block_size)):
            block = table[i]
            if block in self.hash_of or h in self.block_of:
                continue
            self.block_of[h], self.hash_of[block], self.refs[block] = block, h, 1
            self.source_of[block] = (tokens, (i + 1) * self.block_size)
            named += 1
        return named

    def ref(self, block: int) -> None:
        """One more sequence holds `block`."""
        self._require_cached(block)
        self.refs[block] += 1
        self.unused.pop(block, None)

    def unref(self, block: int) -> None:
        """A sequence let go of `block`; at zero it stays cached, most recently used."""
        self._require_cached(block)
        if self.refs[block] <= 0:
            raise LabError(f"Block {block} is released more often than it was taken; the block manager is broken.")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.unused[block] = None

    def evict(self) -> int:
        """Forget the least recently used block no one holds, and return it for reuse."""
        if not self.unused:
            raise LabError("No cached block is free to evict; the scheduler should have preempted first.")
        block, _ = self.unused.popitem(last=False)
        self.evictions += 1
        del self.block_of[self.hash_of.pop(block)], self.refs[block], self.source_of[block]
        return block

    def _require_cached(self, block) -> None:
        if block not in self.refs:
            raise LabError(f"Block {block!r} is not in the prefix cache; only cached blocks are shared.")
