"""Timing one generation step at a chosen position, with and without the KV cache.

Introduced in notebook 01 (KV cache).

A full uncached run of n tokens costs about n^2 / 2 token-forwards, so on a CPU
it quickly takes minutes. To see the whole curve anyway, we time single steps:

* without a cache, the step that produces token p + 1 re-runs the model over
  the whole sequence so far (prompt + p tokens);
* with a cache, the same step is one `decode_step` on one token, attending to a
  cache that already holds as many positions as the prompt and the p - 1 tokens before
  it (`step_timing.filled_cache`, rolled back after each timed call).

Summing the per-step times over positions 0 .. n - 1 (`estimated_total_seconds`)
estimates the total time of an n-token run without running it. The notebook and
the benchmark check the estimate against full runs where those are cheap.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from ..errors import LabError

from ..engine.kv_cache import kv_cache_bytes
from .measure import captured, time_side_by_side
from .step_timing import filled_cache, step_runner
from ..engine.config import ModelConfig

MODES = {True: "cached_s", False: "naive_s"}      # use_cache -> column name of its time


def _dummy_tokens(model, length: int, seed: int = 0) -> torch.Tensor:
    """`length` seeded random token ids, (1, length), on the model's device.
    What the tokens say does not change the time a step takes."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
    return ids.to(model.device)


def _naive_step(model, sequence: torch.Tensor):
    """One step of the uncached loop: the whole sequence through the model, the last logits.
    On a GPU it is replayed as a CUDA graph, as the cached step is (`step_timing.step_runner`),
    so that both sides of the comparison time the GPU's work, not the launches."""
    def run():
        with torch.inference_mode():
            return model.logits(model(sequence), at=-1)
    return captured(run, model.device, f"the uncached step over {sequence.shape[1]} tokens")


def _cached_step(model, sequence: torch.Tensor):
    """One decode step with a cache that already holds as many positions as all but the last
    token of `sequence` (`step_timing`: what they hold does not change the time)."""
    return step_runner(model, filled_cache(model, 1, sequence.shape[1] - 1))


def time_per_token_by_position(model, positions: Iterable[int], prompt_len: int = 16,
                               use_cache: bool | Sequence[bool] = (True, False),
                               repeats: int = 3) -> list[dict]:
    """Time the step that generates token `position + 1`, for each position.

    Introduced in notebook 01 (KV cache).

    positions: how many tokens were already generated (0 = the first new token);
        the model then sees `prompt_len + position` tokens.
    use_cache: True, False, or both (the default); both are timed side by side.
    Returns one dict per position: position, sequence_length, the median
    seconds per step as ``cached_s`` and/or ``naive_s``, and under ``timings`` each
    mode's `measure.Timing.to_dict()` (its spread tells a busy machine: `busy`).
    """
    modes = [use_cache] if isinstance(use_cache, bool) else list(use_cache)
    positions = sorted(set(int(p) for p in positions))
    if prompt_len < 1 or not positions or positions[0] < 0:
        raise LabError("Use prompt_len >= 1 and at least one position >= 0.")
    longest = prompt_len + positions[-1]
    if longest > model.config.max_position:
        raise LabError(f"Position {positions[-1]} after a {prompt_len}-token prompt is past the "
                         f"model's context of {model.config.max_position} tokens.")
    tokens = _dummy_tokens(model, longest)
    rows = []
    for index, position in enumerate(positions):
        sequence = tokens[:, : prompt_len + position]               # (1, prompt_len + position)
        steps = {}
        if True in modes:
            steps[MODES[True]] = _cached_step(model, sequence)
        if False in modes:
            steps[MODES[False]] = _naive_step(model, sequence)
        # one untimed call of each warms up the first position; later ones are warm already
        timings = time_side_by_side(steps, model.device, warmup=1 if index == 0 else 0,
                                    repeats=repeats)
        row = {"position": position, "sequence_length": prompt_len + position}
        row.update({name: timing.median for name, timing in timings.items()})
        row["timings"] = {name: timing.to_dict() for name, timing in timings.items()}
        rows.append(row)
    return rows


def estimated_step_seconds(per_position_rows: Sequence[dict], name: str, new_tokens: int) -> np.ndarray:
    """Estimated seconds of each step 0 .. new_tokens - 1, for the mode `name`
    ("cached_s" or "naive_s"): linear between measured positions, and extended
    along the last (or first) segment's slope outside them.

    Introduced in notebook 01 (KV cache).
    """
    rows = sorted(per_position_rows, key=lambda r: r["position"])
    positions = np.array([r["position"] for r in rows], dtype=float)
    seconds = np.array([r[name] for r in rows], dtype=float)
    wanted = np.arange(new_tokens, dtype=float)
    estimate = np.interp(wanted, positions, seconds)
    if len(positions) >= 2:
        above, below = wanted > positions[-1], wanted < positions[0]
        slope_high = (seconds[-1] - seconds[-2]) / (positions[-1] - positions[-2])
        slope_low = (seconds[1] - seconds[0]) / (positions[1] - positions[0])
        estimate[above] = seconds[-1] + slope_high * (wanted[above] - positions[-1])
        estimate[below] = seconds[0] + slope_low * (wanted[below] - positions[0])
    return np.clip(estimate, 0.0, None)


def estimated_total_seconds(per_position_rows: Sequence[dict], new_tokens: int) -> dict:
    """Estimated seconds to generate `new_tokens` tokens, from per-step times.

    Introduced in notebook 01 (KV cache).

    per_position_rows: rows of `time_per_token_by_position`. Each step's time is
    interpolated linearly between the measured positions (and extended along the
    nearest segment outside them), then summed over positions 0 .. new_tokens - 1.
    Returns {"cached_s": ..., "naive_s": ...} for the modes the rows hold.
    The cached estimate counts the first token as a decode step, not a prefill:
    close for a short prompt.
    """
    if new_tokens < 1:
        raise LabError(f"new_tokens must be at least 1, got {new_tokens}.")
    rows = list(per_position_rows)
    return {name: float(estimated_step_seconds(rows, name, new_tokens).sum())
            for name in MODES.values() if rows and all(name in r for r in rows)}


def gqa_savings(config: ModelConfig, length: int = 1024, batch_size: int = 1,
                dtype: torch.dtype = torch.float32) -> dict:
    """What grouped-query attention saves in cache memory on this model.

    Introduced in notebook 01 (KV cache).

    Compares the cache with the model's `num_kv_heads` key/value heads against
    the same model with full multi-head attention (one key/value head per query
    head). The ratio num_heads / num_kv_heads does not depend on the length.
    """
    full_mha = config.with_(num_kv_heads=config.num_heads)
    grouped = kv_cache_bytes(config, length, batch_size, dtype)
    multi_head = kv_cache_bytes(full_mha, length, batch_size, dtype)
    return {"length": length, "batch_size": batch_size, "kv_heads": config.num_kv_heads,
            "num_heads": config.num_heads, "gqa_bytes": grouped, "mha_bytes": multi_head,
            "ratio": multi_head / grouped}
