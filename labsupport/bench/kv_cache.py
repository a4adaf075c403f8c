"""Notebook 01's section: the chapter's loop without a cache against the static KV cache.

Introduced in notebook 01 (KV cache); ``python -m labsupport bench --sections kv_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason
from ..lab.roofs import fraction_words
from ..claims.kv_cache import step_busy_reason
from ..engine.generation import generate, generate_naive
from ..engine.kv_cache import StaticKVCache, kv_cache_bytes
from ..lab.kv_cache_timing import estimated_total_seconds, gqa_savings, time_per_token_by_position
from ..lab.measure import time_side_by_side
from ..engine.config import PRESETS
from ..lab.workloads import KV_PROMPT
from .core import BenchContext, reported
from .options import SectionOptions, count, counts, seconds


@dataclass(frozen=True)
class KVCacheOptions(SectionOptions):
    """The KV-cache section's options (the same on a CPU and a GPU). Introduced in notebook 01.

    lengths: new-token counts at which the uncached loop is compared with the cache
    (``--kv-lengths``); repeats: timed repeats of each full pair; step_repeats: timed repeats
    of each single step behind the per-position estimate; naive_budget_s: seconds an
    uncached run may take before it is estimated from single steps instead (the shortest
    length always runs in full)."""

    SECTION = "kv_cache"
    lengths: tuple[int, ...] = counts((64, 256, 1024))
    repeats: int = count(1)
    step_repeats: int = count(3)
    naive_budget_s: float = seconds(90.0)


def kv_positions(lengths: list[int]) -> list[int]:
    """Positions at which to time single steps: the first, and the middle and last of
    every length, so that each length's estimate rests on points inside its own range.

    Introduced in notebook 01 (KV cache)."""
    return sorted({0} | {n // 2 for n in lengths} | {n - 1 for n in lengths})


def section_kv_cache(ctx: BenchContext, options: KVCacheOptions) -> dict:
    """The chapter's loop without a cache against the static KV cache.

    Introduced in notebook 01 (KV cache). For each of the options' ``lengths``: a full run
    of both, side by side (``repeats``) and with the same tokens checked, for the
    shortest length and wherever the uncached run is cheap enough (estimated under
    ``naive_budget_s``); otherwise an estimate from single steps timed at a few
    positions (``step_repeats``) and summed over every position (`kv_cache_timing`). The
    figure's note says which. Also the memory arithmetic: GQA's saving, and a 7B cache at
    512 vs 128K (computed from the formula, not measured: its figure says so). A timed
    figure carries the busy reason of its timings (`busy`): their spread, and for the
    estimates a step over more tokens far faster than one over fewer. For the claims
    (`claims.kv_cache.kv_cache_section_claims`) it also allocates a cache at each length
    against the formula, and with one key/value head per query head.
    """
    model, tok = ctx.model(torch.float32)
    ids = tok.encode(KV_PROMPT)
    lengths = sorted(options.lengths)
    budget = options.naive_budget_s

    positions = kv_positions(lengths)
    steps = time_per_token_by_position(model, positions, prompt_len=len(ids), repeats=options.step_repeats)
    steps_busy = step_busy_reason(steps)
    rows, estimated_rows, figures = [], [], []
    for new_tokens in lengths:
        estimate = estimated_total_seconds(steps, new_tokens)
        if new_tokens != lengths[0] and estimate["naive_s"] > budget:
            row, figure = _estimated(new_tokens, estimate, positions, budget, steps_busy)
            estimated_rows.append(row)
        else:
            row, figure = _full_runs(ctx, model, ids, new_tokens, options.repeats, estimate)
            rows.append(row)
        figures.append(figure)

    savings = gqa_savings(model.config, length=1024)
    seven_b = PRESETS["llama-7b-shape"]
    small, large = (kv_cache_bytes(seven_b, n, 1, torch.float16) for n in (512, 128 * 1024))
    figures += _formula_figures(savings, small, large)
    return {"prompt_tokens": len(ids), "per_position_s": steps, "rows": rows,
            "estimated_rows": estimated_rows, "gqa": savings, "figures": figures,
            **allocated_bytes(model, [len(ids) + n for n in lengths]),
            "seven_b": {"weights": seven_b.num_parameters * 2, "at_512": small, "at_128k": large}}


def _estimated(new_tokens: int, estimate: dict, positions: list[int], budget: float,
               steps_busy: str | None) -> tuple[dict, dict]:
    """A length too slow to run uncached, estimated from single steps: (row, figure). Notebook 01 (KV cache)."""
    estimated_speedup = estimate["naive_s"] / estimate["cached_s"]
    row = {"new_tokens": new_tokens, "speedup": estimated_speedup, "estimated_s": estimate}
    figure = reported(
        f"KV cache speedup over the uncached loop, {new_tokens} new tokens (estimated)",
        estimated_speedup, "x", target=4.0 if new_tokens == 256 else None, busy=steps_busy,
        note=f"ESTIMATE, not a full run: single steps timed at positions {positions} and summed over "
             f"positions 0..{new_tokens - 1} ({estimate['naive_s']:.0f} s vs {estimate['cached_s']:.1f} s; "
             f"a full uncached run would take about {estimate['naive_s']:.0f} s, over the "
             f"{budget:.0f} s budget)")
    return row, figure


def _full_runs(ctx: BenchContext, model, ids: list[int], new_tokens: int, repeats: int,
               estimate: dict) -> tuple[dict, dict]:
    """Full runs with and without the cache, side by side, tokens checked: (row, figure). Notebook 01 (KV cache)."""
    estimated_speedup = estimate["naive_s"] / estimate["cached_s"]
    out = {}

    def cached():
        out["cached"] = generate(model, ids, new_tokens, eos_token_ids=())

    def naive():
        out["naive"] = generate_naive(model, ids, new_tokens, eos_token_ids=())

    timings = time_side_by_side({"cached": cached, "naive": naive}, ctx.device,
                                warmup=0, repeats=repeats)
    speedup = timings["naive"].median / timings["cached"].median
    same = out["cached"].tokens.tolist() == out["naive"].tokens.tolist()
    # the cached decode's fractions of read and copy bandwidth: (weights + the cache at its mean
    # length) read per step x decode steps per second
    step_bytes = model.weight_bytes() + kv_cache_bytes(model.config, len(ids) + new_tokens // 2, 1, model.dtype)
    fractions = ctx.hardware.bandwidth_fractions(step_bytes * out["cached"].decode_tokens_per_s)
    row = {"new_tokens": new_tokens, "same_tokens": same, "speedup": speedup,
           "estimated_speedup": estimated_speedup, "estimated_s": estimate,
           "cached_bandwidth_fraction": fractions["bandwidth_fraction"],
           "cached_read_bandwidth_fraction": fractions["read_bandwidth_fraction"],
           "timings_s": {k: v.to_dict() for k, v in timings.items()}}
    figure = reported(
        f"KV cache speedup over the uncached loop, {new_tokens} new tokens", speedup, "x",
        target=4.0 if new_tokens == 256 else None, busy=busy_reason(timings),
        note=f"measured: full runs side by side, {timings['naive'].median:.1f} s vs "
             f"{timings['cached'].median:.2f} s; same tokens: {same}"
             + ("" if same else " (TOKENS DIFFER)")
             + f"; the per-step estimate said {estimated_speedup:.1f}x; the cached decode reached "
             f"{fraction_words(fractions)}")
    return row, figure


def _formula_figures(savings: dict, small: int, large: int) -> list[dict]:
    """GQA's saving, and a 7B model's cache at 128K against 512 tokens, from the formula. Notebook 01 (KV cache)."""
    return [
        reported(f"KV cache saved by grouped-query attention ({savings['kv_heads']} vs "
                 f"{savings['num_heads']} kv heads)", savings["ratio"], "x",
                 note=f"{savings['gqa_bytes'] / 2**20:.0f} MiB vs {savings['mha_bytes'] / 2**20:.0f} MiB "
                      f"at 1024 tokens, fp32, batch 1"),
        reported("KV cache of a 7B model (fp16, batch 1): 128K tokens / 512 tokens, computed",
                 large / small, "x",
                 note=f"computed from the formula, not measured: {small / 2**20:.0f} MiB at 512 tokens, "
                      f"{large / 2**30:.0f} GiB at 128K"),
    ]


def allocated_bytes(model, lengths: list[int]) -> dict:
    """What the claims compare with the formula: {"memory": [(length, formula bytes, bytes a
    StaticKVCache of that length allocated)], "gqa_allocated": {"num_heads", "kv_heads",
    "gqa_bytes", "mha_bytes"} at 256 positions}. Introduced in notebook 01 (KV cache)."""
    config, dtype = model.config, model.dtype

    def allocated(config, length):
        return StaticKVCache(config, batch_size=1, max_len=length, device=model.device, dtype=dtype).nbytes
    memory = [(n, kv_cache_bytes(config, n, 1, dtype), allocated(config, n)) for n in lengths]
    mha = config.with_(num_kv_heads=config.num_heads)
    return {"memory": memory, "gqa_allocated": {"num_heads": config.num_heads, "kv_heads": config.num_kv_heads,
                                                "gqa_bytes": allocated(config, 256), "mha_bytes": allocated(mha, 256)}}
