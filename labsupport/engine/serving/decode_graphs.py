"""The serving engine's decode steps, replayed as CUDA graphs.

Introduced in notebook 06 (continuous batching); notebook 09 serves through it.

On a GPU an eager decode step of a small model is several hundred kernel launches, and
launching them costs more than running them: a served step would measure Python, not the
GPU. A CUDA graph (`graphs.py`) replays a step's kernels in one call, but only at the shapes
it was captured with, from the same buffers. A serving engine's decode step changes shape
all the time (requests come and go; every context grows by one), so, as vLLM and nano-vllm do:

* the batch is padded up to a bucket of rows (1, 2, 4, 8, ..., max_slots); a padding row
  decodes a dummy token in the pool's scratch block, and its logits are dropped;
* the block tables are cut to a bucket of blocks (1, 2, 4, ..., the longest context's), the
  first that holds every row's context: each row reads `width * block_size` positions, and
  the mask hides those past its own position (masked keys weigh exactly zero);
* one graph per (rows, blocks) bucket, all captured when the engine is made, in one memory
  pool. Before each replay the step's inputs are copied into the graph's own buffers: token
  ids (R, 1), positions (R, 1), block tables (R, W).

Prefills and chunked-prefill steps (their shapes are the prompts') stay eager. The graphed step
gives the eager step's logits, up to float rounding (tested). A bucket that cannot be captured
is said, in a warning and `note`, and the engine then decodes eagerly: never silently.
"""

from __future__ import annotations

import time
import warnings

import torch

from ..graphs import CaptureFailed, capture
from ..hardware import synchronize
from .block_manager import blocks_needed

GRAPHED, EAGER = "CUDA graphs (decode steps)", "eager"      # what `DecodeGraphs.path` says


def buckets(largest: int) -> list[int]:
    """1, 2, 4, ... below `largest`, then `largest` itself. Notebook 06 (continuous batching)."""
    sizes = [1 << i for i in range(largest.bit_length()) if 1 << i < largest]
    return sizes + [largest]


class DecodeGraphs:
    """A CUDA graph of the decode step per (rows, blocks) bucket. Notebook 06 (continuous batching).

    runner: the engine's `ModelRunner` (whose `fixed_width_decode` is the captured step);
    max_rows: the most rows a decode step has (the engine's max_slots); capture_fn: how a step
    is captured (default `graphs.capture`; tests pass one that replays eagerly, on a CPU).
    `path`, `note`, `captured` and `capture_seconds` say what happened.
    """

    def __init__(self, runner, max_rows: int, capture_fn=capture):
        cache = runner.cache
        self.runner, self.capture_fn = runner, capture_fn
        longest = min(blocks_needed(runner.model.config.max_position, cache.block_size), cache.num_blocks)
        self.row_buckets, self.width_buckets = buckets(max_rows), buckets(longest)
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.note: str | None = None
        self.capture_seconds = 0.0
        self.pool = torch.cuda.graph_pool_handle() if cache.device.type == "cuda" else None
        self._capture_all()

    @property
    def path(self) -> str:
        """`GRAPHED` while every decode step replays a graph, "eager" after a capture failed."""
        return GRAPHED if self.note is None else EAGER

    @property
    def captured(self) -> int:
        """How many graphs were captured."""
        return len(self.graphs)

    def _capture_all(self) -> None:
        """Capture every bucket, the largest first (later, smaller graphs reuse its pool memory)."""
        start = time.perf_counter()
        for rows in reversed(self.row_buckets):
            for width in reversed(self.width_buckets):
                try:
                    self.graphs[rows, width] = self._capture(rows, width)
                except CaptureFailed as error:
                    self.graphs.clear()
                    self.note = (f"The serving engine decodes eagerly here: {error}, so each of its kernels is "
                                 f"launched on its own.")
                    warnings.warn(self.note, stacklevel=4)
                    return
        synchronize(self.runner.cache.device)
        self.capture_seconds = time.perf_counter() - start

    def _capture(self, rows: int, width: int) -> tuple:
        """The buffers and the replay of one bucket; captured over padding rows (the scratch block)."""
        device, scratch = self.runner.cache.device, self.runner.cache.scratch_block
        ids = torch.zeros(rows, 1, dtype=torch.long, device=device)                    # (R, 1)
        positions = torch.zeros(rows, 1, dtype=torch.long, device=device)              # (R, 1)
        tables = torch.full((rows, width), scratch, dtype=torch.long, device=device)   # (R, W)
        replay = self.capture_fn(lambda: self.runner.fixed_width_decode(ids, positions, tables), device,
                                 f"the serving decode step of {rows} row(s) over {width} block(s)", pool=self.pool)
        return ids, positions, tables, replay

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, context: int, tables_for,
               live_rows: int) -> torch.Tensor | None:
        """Logits (live_rows, vocab) of one decode step, replayed; None when this engine decodes
        eagerly. ids, positions: (B, 1), B rows of which the first `live_rows` are sequences
        (the rest padding rows); context: the longest row's positions after this step;
        tables_for(width): their (B, >= width) block tables."""
        if self.note is not None:
            return None
        rows = next(r for r in self.row_buckets if r >= ids.shape[0])
        needed = blocks_needed(context, self.runner.cache.block_size)
        width = next(w for w in self.width_buckets if w >= needed)
        graph_ids, graph_positions, graph_tables, replay = self.graphs[rows, width]
        batch = ids.shape[0]
        graph_ids.zero_()                            # padding rows: token 0 at position 0 ...
        graph_positions.zero_()
        graph_tables.fill_(self.runner.cache.scratch_block)          # ... in the scratch block
        graph_ids[:batch].copy_(ids)
        graph_positions[:batch].copy_(positions)
        graph_tables[:batch].copy_(tables_for(width)[:, :width])
        return replay()[:live_rows].clone()          # copied out before the next replay overwrites it
