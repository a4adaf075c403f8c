"""Running the model over the sequences a step has scheduled.

Introduced in notebook 06 (continuous batching).

Two kinds of forward pass, both through the paged cache:

* `prefill(seq)`: the sequence's tokens so far (its prompt, plus its output if it is
  resuming after a preemption), written from position 0; the last logits give its
  next token. One sequence per pass: prompts differ in length, and a prefill is
  already compute-bound, so batching prefills buys little on a CPU.
* `decode(seqs)`: one new token for each running sequence, all in one batched
  pass, each row attending to its own context through its own block table.

The runner takes the paged pool it is given (`cache`) and builds the masks with
models/masks.py, like every other caller of the model.
"""

from __future__ import annotations

import torch

from ..models.masks import causal_mask, context_mask
from .paged_cache import PagedKVCache
from .request import ServedSequence


class ModelRunner:
    """Forward passes of scheduled sequences through a paged pool. Notebook 06.

    cache: the `PagedKVCache` to read and write; block_tables: sequence index -> its
    list of block ids (the block manager's `table`).
    """

    def __init__(self, model, cache: PagedKVCache, block_tables):
        self.model, self.cache = model, cache
        self.block_tables = block_tables           # sequence index -> list of block ids
        self.device = model.device

    def _tables(self, seqs: list[ServedSequence], padding_rows: int = 0) -> torch.Tensor:
        """Block tables as one (B, max_blocks) tensor, short rows (and padding rows)
        filled with the scratch block."""
        rows = [self.block_tables(seq.index) for seq in seqs] + [[]] * padding_rows
        width = max(1, max(len(r) for r in rows))
        padded = [r + [self.cache.scratch_block] * (width - len(r)) for r in rows]
        return torch.tensor(padded, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def prefill(self, seq: ServedSequence) -> torch.Tensor:
        """Run every token of `seq` from position 0; returns the last logits (vocab,)."""
        tokens = torch.tensor([seq.tokens], dtype=torch.long, device=self.device)   # (1, T)
        T = tokens.shape[1]
        positions = torch.arange(T, device=self.device)[None]                       # (1, T)
        view = self.cache.view(self._tables([seq]), positions, context_lengths=None)
        mask = causal_mask(T, 0, None, self.device)                                 # "causal"
        logits = self.model.run_layers(tokens, positions, view, mask, last_only=True)
        seq.num_cached = T
        return logits[0, -1]

    @torch.inference_mode()
    def decode(self, seqs: list[ServedSequence], padding_rows: int = 0) -> torch.Tensor:
        """Feed each sequence its last token; returns next-token logits (len(seqs), vocab).

        Padding rows (static batching's finished members) compute like real rows but
        write to the scratch block and attend only to it; their logits are dropped.
        """
        last_tokens = [seq.tokens[-1] for seq in seqs] + [0] * padding_rows
        tokens = torch.tensor(last_tokens, dtype=torch.long, device=self.device)[:, None]  # (B, 1)
        positions = torch.tensor([seq.num_cached for seq in seqs] + [0] * padding_rows,
                                 dtype=torch.long, device=self.device)[:, None]           # (B, 1)
        context = positions[:, 0] + 1                                                    # (B,)
        view = self.cache.view(self._tables(seqs, padding_rows), positions, context)
        mask = context_mask(context)                                                     # (B, 1, 1, S)
        logits = self.model.run_layers(tokens, positions, view, mask)                    # (B, 1, vocab)
        for seq in seqs:
            seq.num_cached += 1
        return logits[: len(seqs), -1]
