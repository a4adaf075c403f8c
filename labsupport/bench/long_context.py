"""Notebook 08's section: the int8 KV cache against the float cache, naive vs fused prefill
attention, and where a decode step's reads cross over from weights to cache.

Introduced in notebook 08 (long context); ``python -m labsupport bench --sections long_context``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason
from ..lab.long_context_bytes import cache_bytes_per_token, decode_weight_bytes
from ..engine.kv_cache import kv_cache_bytes
from ..engine.kv_quant import int8_kv_cache_bytes
from ..lab.long_context import batch_that_fits, time_cache_kinds
from ..engine.config import PRESETS
from ..lab.long_context_prefill import prefill_attention_sweep
from .core import BenchContext, reported
from .options import SectionOptions, count, counts

MIB = 2 ** 20


@dataclass(frozen=True)
class LongContextOptions(SectionOptions):
    """The long-context section's options (the same on a CPU and a GPU). Introduced in notebook 08.

    context: cached positions behind the int8-vs-float decode step (the longest the CPU run
    times); batch: its rows; prefill_lengths: prompt lengths of naive vs fused prefill
    attention (the largest is the reported figure); naive_budget_mib: MiB naive attention's
    score matrices may take before it is no longer run; repeats: timed repeats of each pair,
    interleaved."""

    SECTION = "long_context"
    context: int = count(2048)
    batch: int = count(16)
    prefill_lengths: tuple[int, ...] = counts((512, 1024, 2048))
    naive_budget_mib: int = count(512)
    repeats: int = count(3)


def section_long_context(ctx: BenchContext, options: LongContextOptions) -> dict:
    """The int8 KV cache's bytes and decode speed, naive vs fused prefill memory, the crossovers.

    Introduced in notebook 08 (long context). Figures:

    * the int8 cache's bytes against a 16-bit and an fp32 cache of the same shape (allocated;
      targets 1.9x and 3.8x: a half and a quarter, up to one 2-byte scale per 64 values);
    * one decode step with the float (fp32) cache against the int8 cache, side by side, at
      ``context`` positions and ``batch`` rows (random cache contents), target 1.0x:
      reported as measured (the int8 cache dequantizes what it reads, so on a CPU it may lose);
    * naive / fused prefill attention memory and time at T = 2048 (the largest of
      ``prefill_lengths``; memory measured on CUDA, computed from tensor sizes elsewhere);
    * the crossover contexts at which a decode step reads more cache than weights (computed).

    Its claims: `claims.long_context.long_context_section_claims`.
    """
    model, _ = ctx.model(torch.float32)
    config = model.config
    figures = []

    int8 = int8_kv_cache_bytes(config, options.context, options.batch)
    sixteen = kv_cache_bytes(config, options.context, options.batch, torch.float16)
    fp32 = kv_cache_bytes(config, options.context, options.batch, torch.float32)
    ideal = 2 * config.head_dim / (config.head_dim + 2)
    figures.append(reported("int8 KV cache: bytes of a 16-bit cache / int8 cache", sixteen / int8, "x", target=1.9,
                            note=f"exact: {config.head_dim} int8 bytes + a 2-byte scale per token per kv-head "
                                 f"({ideal:.3f}x); {sixteen / MIB:.0f} MiB vs {int8 / MIB:.0f} MiB"))
    figures.append(reported("int8 KV cache: bytes of an fp32 cache / int8 cache", fp32 / int8, "x", target=3.8,
                            note=f"exact ({2 * ideal:.3f}x with the scales)"))

    # on a GPU, both caches alive at once within a share of the free memory (`batch_that_fits`)
    batch = (batch_that_fits([config, config], options.context, ctx.device, largest=options.batch)
             if ctx.device.type == "cuda" else options.batch)
    speed = time_cache_kinds(model, options.context, batch, repeats=options.repeats)
    ratio = speed["float_s"] / speed["int8_s"]
    figures.append(reported(
        f"int8 vs fp32 KV cache: decode step speedup at context {options.context}, batch {batch}",
        ratio, "x", target=1.0, busy=busy_reason(speed["timings"]),
        note=f"measured side by side: fp32 cache {1e3 * speed['float_s']:.0f} ms, int8 {1e3 * speed['int8_s']:.0f} ms "
             f"per step; this int8 cache dequantizes every position it reads to fp32 before attention (no fused "
             f"int8 attention kernel), so it reads fewer bytes from the cache but writes and reads a float copy: "
             f"below 1.0x that extra pass costs more than the bytes saved"))

    budget = options.naive_budget_mib * MIB
    prefill = prefill_attention_sweep(config, options.prefill_lengths, budget, ctx.device,
                                      repeats=options.repeats)
    largest = prefill[-1]
    if largest["naive_over_budget"]:
        figures.append(reported(f"naive attention at T={largest['T']}", largest["naive_bytes"] / MIB, "MiB",
                                note=f"computed; over the {options.naive_budget_mib} MiB budget, not run"))
    else:
        figures.append(reported(
            f"prefill attention memory at T={largest['T']}: naive / fused (one layer)",
            largest["naive_bytes"] / largest["fused_bytes"], "x",
            note=f"{largest['memory']}: naive {largest['naive_bytes'] / MIB:.0f} MiB, fused "
                 f"{largest['fused_bytes'] / MIB:.1f} MiB"))
        figures.append(reported(
            f"prefill attention time at T={largest['T']}: naive / fused (one layer)",
            largest["naive_s"] / largest["fused_s"], "x", busy=busy_reason(largest["timings"]),
            note=f"side by side: naive {1e3 * largest['naive_s']:.1f} ms, fused {1e3 * largest['fused_s']:.1f} ms"))

    seven_b = PRESETS["llama-7b-shape"]
    curves = [{"model": f"{config.name} (fp32)", "weight_bytes": model.weight_bytes(),
               "cache_bytes_per_token": cache_bytes_per_token(config, "fp32"), "batches": [1, 16]},
              {"model": "7B shape (fp16)", "weight_bytes": decode_weight_bytes(seven_b, 2),
               "cache_bytes_per_token": cache_bytes_per_token(seven_b, "fp16/bf16"), "batches": [1, 16]}]
    crossovers = [{"model": c["model"], "batch": batch, "context": c["weight_bytes"] / (batch * c["cache_bytes_per_token"])}
                  for c in curves for batch in c["batches"]]
    for c in crossovers:
        figures.append(reported(f"crossover context, {c['model']}, batch {c['batch']} (computed)", c["context"],
                                "tokens", note="computed, not measured: weight bytes / (batch x cache bytes per token)"))
    return {"int8_bytes": {"int8": int8, "sixteen_bit": sixteen, "fp32": fp32, "head_dim": config.head_dim},
            "int8_speed": speed, "prefill": prefill, "naive_budget_bytes": budget, "crossovers": crossovers,
            "crossover_curves": curves, "figures": figures}
