"""Prefill attention two ways: the naive one that builds the T x T score matrix, and the fused
one (`scaled_dot_product_attention`) that never does.

Introduced in notebook 08 (long context).

Naive attention computes, for each head, scores = q k^T / sqrt(d) (T x T numbers), masks the
upper triangle, takes a softmax (another T x T) and multiplies by v. Its memory grows as T^2:
one layer of SmolLM2 (9 heads) at T = 8192 needs 9 x 8192^2 x 4 bytes = 2.25 GiB for the
scores alone, in fp32.

The fused kernel (FlashAttention and its CPU counterpart) cuts q into blocks of rows and k, v
into blocks of columns, and walks each row block along the columns, keeping per row only a
running maximum, a running sum and the running output (the "online softmax"). It computes the
same numbers, but holds one tile of scores at a time: memory O(T x d) instead of O(T^2).
`plots.long_context.tiling_figure` draws the walk.

`prefill_attention_sweep` times both side by side at growing T, until the naive one's
score matrices would exceed a stated memory budget. Memory: on CUDA each is measured
(`measure.track_peak_memory`, exact there); elsewhere it is computed from the tensor sizes
(`naive_attention_bytes`, `fused_attention_bytes`), because a CPU process only reports its
all-time peak, which a later, smaller block cannot move. Each row says which.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import LabError
from .measure import time_side_by_side, track_peak_memory
from ..engine.models.config import ModelConfig


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention the textbook way, materialising the scores.

    Introduced in notebook 08 (long context). q, k, v: (batch, heads, T, head_dim), with as
    many kv-heads as query heads. Returns (batch, heads, T, head_dim)."""
    T = q.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])               # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)    # (T, T) True above the diagonal
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)     # (B, H, T, T)
    return weights @ v                                                      # (B, H, T, head_dim)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same causal attention through `F.scaled_dot_product_attention` (a fused kernel
    where the device has one). Introduced in notebook 08 (long context)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def naive_attention_bytes(batch: int, heads: int, T: int, bytes_per_value: int) -> int:
    """Bytes of the two T x T tensors naive attention holds at once (scores, then the softmax
    weights), per layer: 2 x batch x heads x T^2 x bytes. Introduced in notebook 08."""
    return 2 * batch * heads * T * T * bytes_per_value


def fused_attention_bytes(batch: int, heads: int, T: int, head_dim: int, bytes_per_value: int) -> int:
    """Bytes the fused kernel holds beyond its inputs: the output (batch x heads x T x head_dim)
    plus a running max and sum per row. Tiles of scores are a few KiB and are left out.
    Introduced in notebook 08 (long context)."""
    return batch * heads * T * (head_dim * bytes_per_value + 2 * 4)


def attention_inputs(config: ModelConfig, T: int, batch: int = 1, device="cpu",
                     dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random q, k, v of one layer of `config`, each (batch, num_heads, T, head_dim): what the
    values are does not change the time or the memory. Introduced in notebook 08."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, config.num_heads, T, config.head_dim)
    return tuple(torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for _ in range(3))


def _peak_bytes(fn, device: torch.device) -> int:
    with track_peak_memory(device) as mem:
        fn()
    return mem.peak_bytes


def prefill_attention_sweep(config: ModelConfig, lengths: Sequence[int], budget_bytes: int, device="cpu",
                            dtype: torch.dtype = torch.float32, repeats: int = 3) -> list[dict]:
    """Naive vs fused causal attention of one layer of `config`, at each prompt length T.

    Introduced in notebook 08 (long context). Both run side by side (interleaved,
    `measure.time_side_by_side`) while the naive one's computed memory stays within
    `budget_bytes`; past it, the fused one runs alone and the row says the naive one was
    over the budget. Rows: T, naive_s and fused_s (medians, None when not run),
    naive_bytes and fused_bytes, memory ("measured" on CUDA, else "computed"),
    naive_over_budget, max_difference (largest |naive - fused|), and timings
    ({name: Timing.to_dict()}: their spread tells a busy machine).
    """
    device = torch.device(device)
    lengths = sorted(set(int(T) for T in lengths))
    if not lengths or lengths[0] < 1 or budget_bytes <= 0:
        raise LabError("Give at least one prompt length of 1 or more and a positive memory budget.")
    value_bytes = torch.empty((), dtype=dtype).element_size()
    measured = device.type == "cuda"
    rows = []
    for index, T in enumerate(lengths):
        q, k, v = attention_inputs(config, T, 1, device, dtype)
        naive_bytes = naive_attention_bytes(1, config.num_heads, T, value_bytes)
        fused_bytes = fused_attention_bytes(1, config.num_heads, T, config.head_dim, value_bytes)
        over = naive_bytes > budget_bytes
        with torch.inference_mode():
            steps = {"fused_s": lambda: fused_attention(q, k, v)}
            if not over:
                steps["naive_s"] = lambda: naive_attention(q, k, v)
            timings = time_side_by_side(steps, device, warmup=1 if index == 0 else 0, repeats=repeats)
            difference = None
            if not over:
                difference = (naive_attention(q, k, v) - fused_attention(q, k, v)).abs().max().item()
            if measured:
                fused_bytes = _peak_bytes(steps["fused_s"], device)
                naive_bytes = _peak_bytes(steps["naive_s"], device) if not over else naive_bytes
        rows.append({"T": T, "naive_s": timings["naive_s"].median if not over else None,
                     "fused_s": timings["fused_s"].median, "naive_bytes": naive_bytes, "fused_bytes": fused_bytes,
                     "memory": "measured" if measured else "computed", "naive_over_budget": over,
                     "max_difference": difference,
                     "timings": {name: t.to_dict() for name, t in timings.items()}})
    return rows
