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
`plots.long_context.tiling_figure` draws the walk, `tiled_attention` is that walk in plain torch
(the reference of notebook 08's exercise), and `LargestTensor` records the largest tensor a
function creates, which tells a tiled function from one that builds the whole score matrix.

`prefill_attention_sweep` times both side by side at growing T, until the naive one's
score matrices would exceed a stated memory budget. Memory: on CUDA each is measured
(`measure.track_peak_memory`, exact there); elsewhere it is computed from the tensor sizes
(`naive_attention_bytes`, `fused_attention_bytes`), because a CPU process only reports its
all-time peak, which a later, smaller block cannot move. Each row says which.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import LabError
from .measure import time_side_by_side, track_peak_memory
from ..engine.config import ModelConfig


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


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int,
                    causal: bool = False) -> torch.Tensor:
    """Attention one tile of keys and values at a time, with an online softmax (FlashAttention's
    running max, running sum and rescale), never holding more than (queries x tile) scores.

    Introduced in notebook 08 (long context): the reference of its exercise. q: (batch, heads,
    Tq, d); k, v: (batch, kv_heads, Tk, d) with heads a multiple of kv_heads (query head h reads
    kv-head h // (heads / kv_heads), as in GQA); causal: query i sees keys 0..i (Tq == Tk, as
    in a prefill). Returns (batch, heads, Tq, d), what `F.scaled_dot_product_attention` gives."""
    batch, heads, n_q, d = q.shape
    group = heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                                    # (B, H, Tk, d): GQA's sharing
    v = v.repeat_interleave(group, dim=1)                                    # (B, H, Tk, d)
    row_max = q.new_full((batch, heads, n_q, 1), float("-inf"))              # (B, H, Tq, 1): running max
    row_sum = q.new_zeros(batch, heads, n_q, 1)                              # (B, H, Tq, 1): running sum
    out = q.new_zeros(batch, heads, n_q, d)                                  # (B, H, Tq, d): running output
    rows = torch.arange(n_q, device=q.device)[:, None]                       # (Tq, 1): query positions
    for start in range(0, k.shape[2], tile):                                 # the last tile may be short
        k_tile, v_tile = k[:, :, start:start + tile], v[:, :, start:start + tile]   # (B, H, t, d)
        scores = q @ k_tile.transpose(-2, -1) / math.sqrt(d)                 # (B, H, Tq, t): one tile
        if causal:
            columns = torch.arange(start, start + k_tile.shape[2], device=q.device)[None, :]   # (1, t)
            scores = scores.masked_fill(columns > rows, float("-inf"))       # the future of each query
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (B, H, Tq, 1)
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)       # rows that saw no key yet
        weights = torch.exp(scores - safe_max)                               # (B, H, Tq, t)
        rescale = torch.exp(row_max - safe_max)                              # old sums in the new max's units
        row_sum = row_sum * rescale + weights.sum(dim=-1, keepdim=True)
        out = out * rescale + weights @ v_tile
        row_max = new_max
    return out / row_sum


class LargestTensor(TorchFunctionMode):
    """A context in which every torch call is recorded: `largest` holds the shape, dtype and
    size in bytes of the largest tensor any call returned, and `calls` the names called.

    Introduced in notebook 08 (long context): a tiled attention never makes a tensor of
    (queries x keys) scores, a naive one does; the exercise's checker and `tiled_vs_fused`
    read it. Torch calls made inside other torch calls (a kernel's own work) are not seen."""

    def __init__(self):
        super().__init__()
        self.largest: tuple[tuple[int, ...], torch.dtype, int] = ((), torch.float32, 0)
        self.shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.calls.append(getattr(func, "__name__", str(func)))
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                self.shapes.append((tuple(tensor.shape), tensor.dtype))
                nbytes = tensor.numel() * tensor.element_size()
                if nbytes > self.largest[2]:
                    self.largest = (tuple(tensor.shape), tensor.dtype, nbytes)
        return result


def tiled_vs_fused(tiled: Callable, config: ModelConfig, T: int, tile: int, device="cpu",
                   repeats: int = 3) -> dict:
    """A tiled attention (`tiled(q, k, v, tile, causal=True)`, the learner's or `tiled_attention`)
    against naive and fused causal attention on one layer of `config` at T tokens, side by side.

    Introduced in notebook 08 (long context). Returns tiled_s, naive_s, fused_s (medians), the
    largest tensor each of tiled and naive created (tiled_largest_bytes, naive_largest_bytes,
    recorded by `LargestTensor`; the inputs' own bytes as input_bytes), max_difference
    (largest |tiled - fused|), and timings ({name: Timing.to_dict()})."""
    q, k, v = attention_inputs(config, T, 1, device)
    with torch.inference_mode():
        timings = time_side_by_side({"tiled_s": lambda: tiled(q, k, v, tile, causal=True),
                                     "naive_s": lambda: naive_attention(q, k, v),
                                     "fused_s": lambda: fused_attention(q, k, v)}, device, repeats=repeats)
        sizes = {}
        for name, fn in (("tiled", lambda: tiled(q, k, v, tile, causal=True)), ("naive", lambda: naive_attention(q, k, v))):
            with LargestTensor() as record:
                result = fn()
            sizes[name] = record.largest[2]
            if name == "tiled":
                difference = (result.float() - fused_attention(q, k, v).float()).abs().max().item()
    return {"T": T, "tile": tile, **{name: t.median for name, t in timings.items()},
            "tiled_largest_bytes": sizes["tiled"], "naive_largest_bytes": sizes["naive"],
            "input_bytes": q.numel() * q.element_size(), "max_difference": difference,
            "timings": {name: t.to_dict() for name, t in timings.items()}}


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
