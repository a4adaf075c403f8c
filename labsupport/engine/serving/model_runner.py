"""Running the model over the sequences a step has scheduled.

Introduced in notebook 06 (continuous batching).

One kind of forward pass, `forward(seqs, chunks)`, through the paged cache: row b
computes the next `chunks[b]` tokens of sequence b, from its `num_cached` on. The
runner is pure: it writes those positions' keys and values into the pool and returns
logits, and moves no counter; the scheduler's `postprocess` advances `num_cached`. A
decode is a chunk of one token; a prompt, or a piece of one (chunked prefill), is a
longer chunk. Three layouts, one rule (each query sees its own sequence's cached
context, then its chunk up to itself):

* one sequence from position 0 (a fresh prompt): plain causal attention over the new
  tokens, no gather, no mask;
* rows that all bring as many tokens (a decode batch: one each): a (B, T) batch,
  `masks.chunk_mask`;
* chunks of different lengths (chunked prefill beside decodes): packed into ONE row of
  all their tokens, no padding, each chunk kept to its own keys by `masks.packed_mask`;
  only each chunk's last token goes through the output layer.

Every mask comes from masks.py with the model's `config.attention_window`, so a model with a
sliding window (`Transformer.with_attention_window`, notebook 08) is served windowed.
`prefill(seq)` and `decode(seqs)` are the two everyday cases. Block tables come from
the block manager's tensor (`BlockManager.table_rows`): one index per step.
"""

from __future__ import annotations

import torch

from ...errors import LabError
from ..models.masks import causal_mask, chunk_mask, packed_mask
from .block_manager import BlockManager, blocks_needed
from .paged_cache import PagedKVCache, PagedView
from .request import ServedSequence


class ModelRunner:
    """Forward passes of scheduled sequences through a paged pool. Notebook 06.

    cache: the `PagedKVCache` to read and write; blocks: the `BlockManager` whose
    tables to use (None: a runner of `fixed_width_decode` only, whose tables are given);
    attention: "gather" (copy each row's context out of the pool) or "pool" (attend
    over the pool in place, with a mask; see paged_cache.py); reader: the view class every
    pass reads the pool through (`PagedView`, or a subclass: decode_cost.py's times its gathers).
    Both are chosen once, here.
    """

    def __init__(self, model, cache: PagedKVCache, blocks, attention: str = "gather", reader: type = PagedView):
        if attention not in ("gather", "pool"):
            raise LabError(f"attention must be 'gather' or 'pool', got {attention!r}.")
        if blocks is not None and not isinstance(blocks, BlockManager):
            raise LabError(f"blocks must be the BlockManager of the pool's blocks, got {type(blocks).__name__}.")
        if not (isinstance(reader, type) and issubclass(reader, PagedView)):
            raise LabError(f"reader must be PagedView or a subclass of it, got {reader!r}.")
        self.model, self.cache, self.reader = model, cache, reader
        self.blocks = blocks
        self.attention = attention
        self.device = model.device
        self.window = model.config.attention_window        # sliding-window attention (notebook 08), or None
        self.graphs = None          # the engine's `DecodeGraphs` on a GPU: decode steps replay a CUDA graph

    def tables(self, seqs: list[ServedSequence], padding_rows: int = 0, width: int = 1) -> torch.Tensor:
        """Block tables as one (B, >= width) tensor, short rows (and padding rows) filled with
        the scratch block."""
        return self.blocks.table_rows([seq.index for seq in seqs], padding_rows, width)

    @torch.inference_mode()
    def forward(self, seqs: list[ServedSequence], chunks: list[int], padding_rows: int = 0) -> torch.Tensor:
        """Compute the next chunks[b] tokens of each sequence; returns the logits after each
        row's last token (len(seqs), vocab). Padding rows (static batching's finished
        members) compute one token each in the scratch block; their logits are dropped."""
        starts = [seq.num_cached for seq in seqs] + [0] * padding_rows
        lengths = list(chunks) + [1] * padding_rows
        rows = [seq.tokens[start: start + n] for seq, start, n in zip(seqs, starts, lengths)] + [[0]] * padding_rows
        if len(rows) == 1 and starts[0] == 0:
            logits = self._fresh_prompt(seqs[0], rows[0])
        elif len(set(lengths)) == 1:                     # decodes: every row brings as many tokens
            logits = self._batched(seqs, starts, rows, padding_rows)
        else:                                            # chunks of different lengths
            logits = self._packed(seqs, starts, rows, padding_rows)
        return logits[: len(seqs)]

    def _fresh_prompt(self, seq: ServedSequence, tokens: list[int]) -> torch.Tensor:
        """One sequence from position 0: causal attention over its own new tokens."""
        T = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)             # (1, T)
        positions = torch.arange(T, device=self.device)[None]                          # (1, T)
        view = self.cache.view(self.tables([seq], width=blocks_needed(T, self.cache.block_size)),
                               positions, context_lengths=None, reader=self.reader)
        mask = causal_mask(T, 0, None, self.device, window=self.window)               # "causal", or windowed
        return self.model.logits(self.model(ids, positions, view, mask), at=-1)         # (1, vocab)

    def _batched(self, seqs, starts, rows, padding_rows) -> torch.Tensor:
        """Rows of T new tokens each, every row after its own context: a (B, T) batch."""
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)                  # (B, T)
        T = ids.shape[1]
        positions = torch.tensor(starts, device=self.device)[:, None] + torch.arange(T, device=self.device)
        if T == 1 and self.graphs is not None and self.attention == "gather":
            replayed = self.graphs.decode(ids, positions, max(starts) + 1,
                                          lambda width: self.tables(seqs, padding_rows, width), len(seqs))
            if replayed is not None:
                return replayed                                                         # (len(seqs), vocab)
        context = positions[:, -1] + 1                                                  # (B,)
        width = blocks_needed(int(context.max()), self.cache.block_size)
        view = self.cache.view(self.tables(seqs, padding_rows, width), positions, context,
                               over_pool=self.attention == "pool", reader=self.reader)
        if T == 1 and self.window is None and self.attention == "gather" and self.device.type == "cpu":
            view.one_token_per_row(context)           # each row's length is its whole mask (fused.decode_block)
        mask = chunk_mask(positions, window=self.window)                                # (B, 1, T, S)
        if self.attention == "pool":
            mask = view.pool_mask(mask)                                                 # (B, 1, T, span)
        return self.model.logits(self.model(ids, positions, view, mask), at=-1)         # (B, vocab)

    @torch.inference_mode()
    def fixed_width_decode(self, ids: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """One token per row, each row reading the first W blocks of its table: ids, positions
        (B, 1), tables (B, W). Every shape is fixed by the inputs' and nothing waits for the
        device: the step `decode_graphs.py` captures. Returns logits (B, vocab)."""
        width = tables.shape[1] * self.cache.block_size                                # keys per row
        view = self.cache.view(tables, positions, width, reader=self.reader)
        mask = chunk_mask(positions, window=self.window, num_keys=width)              # (B, 1, 1, width)
        return self.model.logits(self.model(ids, positions, view, mask), at=-1)         # (B, vocab)

    def _packed(self, seqs, starts, rows, padding_rows) -> torch.Tensor:
        """Chunks of different lengths packed into one row of N tokens, no padding: the
        linear layers see exactly the tokens to compute; attention keeps each chunk to its
        own sequence (`masks.packed_mask`)."""
        lengths = torch.tensor([len(row) for row in rows], device=self.device)         # (B,)
        ids = torch.tensor([[t for row in rows for t in row]], dtype=torch.long, device=self.device)   # (1, N)
        token_rows = torch.repeat_interleave(torch.arange(len(rows), device=self.device), lengths)  # (N,)
        ends = lengths.cumsum(0)                                                        # (B,)
        offset = torch.arange(ids.shape[1], device=self.device) - (ends - lengths)[token_rows]   # (N,) place in chunk
        positions = torch.tensor(starts, device=self.device)[token_rows] + offset      # (N,)
        context = torch.tensor(starts, device=self.device) + lengths                   # (B,)
        width = blocks_needed(int(context.max()), self.cache.block_size)
        view = self.cache.packed_view(self.tables(seqs, padding_rows, width), token_rows, positions, context,
                                      over_pool=self.attention == "pool", reader=self.reader)
        mask = packed_mask(token_rows, positions, len(rows), width * self.cache.block_size,
                           window=self.window)                                          # (1, 1, N, K)
        if self.attention == "pool":
            mask = view.pool_mask(mask)                                                 # (1, 1, N, span)
        hidden = self.model(ids, positions[None], view, mask)                           # (1, N, hidden)
        return self.model.logits(hidden, at=ends - 1)[0]       # each chunk's last token only: (B, vocab)

    def prefill(self, seq: ServedSequence) -> torch.Tensor:
        """Run every token of `seq` not in the cache yet; returns the last logits (vocab,)."""
        return self.forward([seq], [len(seq.tokens) - seq.num_cached])[0]

    def decode(self, seqs: list[ServedSequence], padding_rows: int = 0) -> torch.Tensor:
        """Feed each sequence its last token; returns next-token logits (len(seqs), vocab)."""
        return self.forward(seqs, [1] * len(seqs), padding_rows)

