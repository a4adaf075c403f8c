"""Batching prompts of different lengths: left padding, the attention mask, positions.

Introduced in notebook 02 (batching).

A batch shares one KV cache write position per step (`StaticKVCache.length`), so
prompts of different lengths are lined up on the right: shorter ones get padding
tokens on the left. Three things keep the padding invisible:

* the attention mask hides padding keys from every query;
* position ids count real tokens only (a row's first real token is position 0);
* a row that ends (end-of-sequence) stops counting tokens while the others go on.

The padding still costs arithmetic: `padding_waste` says how much, and sorting
prompts by length before batching them is the usual remedy.
"""

from __future__ import annotations

from ..engine.hardware import pick_device
from ..errors import LabError
from .workloads import preset


def sorted_batches(prompts: list, batch_size: int) -> list[list[int]]:
    """Indices of `prompts` grouped into batches of similar length (longest first),
    the usual remedy for padding waste. Returns a list of index lists. Notebook 02 (batching)."""
    if batch_size < 1:
        raise LabError(f"batch_size must be at least 1, got {batch_size}.")
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


# --- measuring throughput and latency against batch size (notebook 02) -------------------

def batch_sizes(device) -> list[int]:
    """Batch sizes for the sweep, the device's preset (``batch_sizes`` of `workloads.PRESETS`):
    up to 64 on a CPU, 512 on a GPU.

    Introduced in notebook 02 (batching)."""
    return list(preset(pick_device(device)).batch_sizes)


def combined_waste(batches: list[list[int]]) -> float:
    """Padding waste of several batches together (each padded to its own longest prompt):
    1 - all real tokens / all token slots. `batches`: a list of lists of prompt lengths.

    Introduced in notebook 02 (batching)."""
    slots = sum(len(b) * max(b) for b in batches if b)
    if slots == 0:
        raise LabError("combined_waste needs at least one non-empty batch of lengths.")
    return 1.0 - sum(sum(b) for b in batches) / slots


def spread_lengths(batch: int, longest: int, spread: float) -> list[int]:
    """Prompt lengths for a batch: from `longest` down to `longest` x (1 - spread), evenly.

    Introduced in notebook 02 (batching). spread 0: all equal (no padding);
    spread 1: the shortest prompt has a single token.
    """
    if not 0.0 <= spread <= 1.0:
        raise LabError(f"spread must be between 0 and 1, got {spread}.")
    if batch == 1:
        return [longest]
    return [max(1, round(longest * (1 - spread * i / (batch - 1)))) for i in range(batch)]


def prompts_of_lengths(token_ids: list[int], lengths: list[int]) -> list[list[int]]:
    """Prompts cut from one long list of ids (repeated if too short), one per length.

    Introduced in notebook 02 (batching)."""
    if not token_ids:
        raise LabError("prompts_of_lengths needs some token ids to cut prompts from.")
    longest = max(lengths)
    source = (list(token_ids) * (longest // len(token_ids) + 1))[:longest]
    return [source[:n] for n in lengths]


def scaling_stops_at(rows: list[dict], efficiency: float = 0.5) -> int | None:
    """The smallest batch whose tokens/s is below `efficiency` x (batch x batch-1 tokens/s).

    Introduced in notebook 02 (batching). Up to there extra rows are nearly free;
    from there on, each row costs real time (None: scaling held over the whole sweep).
    """
    rows = sorted(rows, key=lambda r: r["batch"])
    base = rows[0]["tokens_per_s"] / rows[0]["batch"]
    return next((r["batch"] for r in rows if r["tokens_per_s"] < efficiency * base * r["batch"]), None)
