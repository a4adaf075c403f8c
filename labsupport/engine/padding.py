"""Left padding: prompts of different lengths lined up in one batch.

Introduced in notebook 02 (batching).

A batch shares one KV cache write position per step (`StaticKVCache.length`), so
prompts of different lengths are lined up on the right: shorter ones get padding
tokens on the left. Three things keep the padding invisible:

* the attention mask hides padding keys from every query;
* position ids count real tokens only (a row's first real token is position 0);
* a row that ends (end-of-sequence) stops counting tokens while the others go on.

The padding still costs arithmetic: `padding_waste` says how much (the measurements
are in lab/batching.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import LabError


@dataclass
class PaddedBatch:
    """Left-padded prompts. tokens, attention_mask, positions: (batch, T). Notebook 02 (batching)."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor        # True for real tokens, False for padding
    positions: torch.Tensor             # 0, 1, 2, ... along each row's real tokens
    lengths: list[int]

    @property
    def is_padded(self) -> bool:
        return min(self.lengths) != max(self.lengths)

    @property
    def padding_fraction(self) -> float:
        return padding_waste(self.lengths)


def left_pad(prompts, pad_id: int, device="cpu") -> PaddedBatch:
    """Line prompts (lists of ids, or a (batch, T) tensor) up on the right with `pad_id`.
    Notebook 02 (batching)."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    elif prompts and isinstance(prompts[0], int):
        prompts = [list(prompts)]
    if not prompts:
        raise LabError("The prompt is empty (no token ids and no prompts); give at least one token.")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise LabError(f"Prompt {lengths.index(0)} of the batch is empty; give every prompt at least one token.")
    width = max(lengths)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = True
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)            # (batch, T)
    return PaddedBatch(tokens.to(device), mask.to(device), positions.to(device), lengths)


def padding_waste(lengths: list[int]) -> float:
    """Fraction of a padded prefill's token slots that are padding: 1 - sum(L) / (B * max L).
    Notebook 02 (batching)."""
    if not lengths:
        raise LabError("padding_waste needs at least one prompt length.")
    return 1.0 - sum(lengths) / (len(lengths) * max(lengths))
