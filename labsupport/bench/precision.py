"""Notebook 03's section: memory per dtype; fp32 against 16-bit in decode and prefill; agreement.

Introduced in notebook 03 (mixed precision); ``python -m labsupport bench --sections precision``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason
from ..lab.roofs import fraction_words
from ..engine.hardware import bf16_emulated, bf16_supported, dtype_label, dtype_name, fp16_fast
from ..engine.compiled import CUDA_GRAPHS
from ..lab.measure import time_side_by_side, timed_compile
from ..engine.config import PRESETS
from ..lab.precision import (MIB, bf16_report, decode_run, emulation_note, logit_agreement, parameter_bytes,
                             prefill_run)
from ..engine.precision import tensor_bytes
from ..lab.workloads import LIGHTHOUSE_PROMPT
from .core import BenchContext, reported
from .options import SectionOptions, count


@dataclass(frozen=True)
class PrecisionOptions(SectionOptions):
    """The precision section's options (the same on a CPU and a GPU). Introduced in notebook 03.

    new_tokens: new tokens of the decode timing (batch 1); prefill_tokens: prompt length of
    the prefill timing; repeats: timed repeats of each, interleaved."""

    SECTION = "precision"
    new_tokens: int = count(32)
    prefill_tokens: int = count(512)
    repeats: int = count(5)


@dataclass(frozen=True)
class _Timings:
    """The decode and prefill timings, side by side, and what they timed. Notebook 03 (mixed precision)."""

    decode: dict                    # name -> Timing of `new_tokens` new tokens at batch 1
    prefill: dict                   # name -> Timing of a `prompt_tokens`-token prefill
    new_tokens: int
    prompt_tokens: int
    path: str                       # the decode path


def section_precision(ctx: BenchContext, options: PrecisionOptions) -> dict:
    """Memory per dtype; fp32 against 16-bit in decode (batch 1) and prefill; agreement.

    Introduced in notebook 03 (mixed precision). Every precision is the run's variant
    (`BenchContext.variants`), cast from the one fp32 model; the decode and prefill timings run
    the same precisions of `BenchContext.timing_variants` (the course's model but on a big GPU,
    where they are random weights at SmolLM2-1.7B's shape: ``timed_model``), while memory and
    agreement stay the course's model's. Its claims: `claims.precision.precision_section_claims`.
    """
    model, tok = ctx.model(torch.float32)
    models, timed = _precisions(ctx)
    gpt2 = PRESETS["gpt2"].num_parameters
    memory = {name: tensor_bytes(m) for name, m in models.items()}
    figures = [_gpt2_figure(gpt2)]

    ids = tok.encode(LIGHTHOUSE_PROMPT)
    long_prompt = (ids * 64)[: options.prefill_tokens]
    t = _time(ctx, timed, ids, long_prompt, options)
    probe_tokens = torch.tensor([long_prompt[:128]], device=ctx.device)
    rows = {}
    for name, m in models.items():
        rows[name] = {"bytes": memory[name],
                      "decode_speedup": t.decode["float32"].median / t.decode[name].median,
                      "prefill_speedup": t.prefill["float32"].median / t.prefill[name].median,
                      # weights read per token x tokens/s (the short prompt's prefill counted in the time)
                      **ctx.hardware.bandwidth_fractions(timed[name].weight_bytes() * t.new_tokens
                                                         / t.decode[name].median),
                      **(logit_agreement(model, m, probe_tokens) if name != "float32" else {})}
        if name != "float32":
            rows[name]["emulated"] = bool(emulation_note(ctx.device, name))
            figures += _half_figures(ctx, name, rows, t)
    return {"models": rows, "memory_bytes": memory, "bf16": bf16_report(ctx.device), "speeds": _speeds(ctx, models, t),
            "device": str(ctx.device), "model_name": model.config.name, "timed_model": ctx.timed_model,
            "note": ctx.timed_note(),
            "gpt2_mib": {d: parameter_bytes(gpt2, d) / MIB for d in ("float32", "float16")},
            "timings_s": {"decode": {k: v.to_dict() for k, v in t.decode.items()},
                          "prefill": {k: v.to_dict() for k, v in t.prefill.items()}},
            "figures": figures}


def _precisions(ctx: BenchContext) -> tuple[dict, dict]:
    """fp32 and the 16-bit dtypes worth timing here: (variants, timed variants). Notebook 03 (mixed precision)."""
    # bf16 where the hardware has it, and emulated on a CPU without it (labelled so);
    # fp16 only where it is fast (emulated fp16 is notebook 03's to show, not the bench's)
    half = [torch.bfloat16] if bf16_supported(ctx.device) or bf16_emulated(ctx.device) else []
    if ctx.device.type == "cuda" or fp16_fast(ctx.device):
        half.append(torch.float16)
    models = {name: ctx.variants.get(name) for name in ["float32"] + [dtype_name(d) for d in half]}
    timed = {name: ctx.timing_variants.get(name) for name in models}       # what the speed rows time
    return models, timed


def _gpt2_figure(gpt2: int) -> dict:
    """GPT-2's weights in fp16 as a fraction of fp32, counted from its config. Notebook 03 (mixed precision)."""
    return reported("GPT-2 weights in fp32 / fp16 (counted from its config)",
                    parameter_bytes(gpt2, "float16") / parameter_bytes(gpt2, "float32"), "fraction",
                    note=f"{gpt2:,} parameters: {parameter_bytes(gpt2, 'float32') / 2**20:.1f} MiB fp32, "
                         f"{parameter_bytes(gpt2, 'float16') / 2**20:.1f} MiB fp16")


def _time(ctx: BenchContext, timed: dict, ids: list[int], long_prompt: list[int],
          options: PrecisionOptions) -> _Timings:
    """Every timed precision's decode, then its prefill, each side by side. Notebook 03 (mixed precision)."""
    # on a GPU each decode is a replayed CUDA graph, else a LabError (`precision.decode_run`)
    path = CUDA_GRAPHS if timed_compile(ctx.device) else "eager"
    decode_t = time_side_by_side({n: decode_run(m, ids, options.new_tokens) for n, m in timed.items()}, ctx.device,
                                 repeats=options.repeats)
    prefill_t = time_side_by_side({n: prefill_run(m, long_prompt) for n, m in timed.items()}, ctx.device,
                                  repeats=options.repeats)
    return _Timings(decode_t, prefill_t, options.new_tokens, len(long_prompt), path)


def _half_figures(ctx: BenchContext, name: str, rows: dict, t: _Timings) -> list[dict]:
    """A 16-bit dtype's decode and prefill speed over fp32's, and its top-1 agreement. Notebook 03 (mixed precision)."""
    label, emulated = dtype_label(ctx.device, name), emulation_note(ctx.device, name)
    # each ratio stands on two timings: its own and fp32's, taken side by side
    decode_busy = busy_reason({"float32": t.decode["float32"], name: t.decode[name]})
    prefill_busy = busy_reason({"float32": t.prefill["float32"], name: t.prefill[name]})
    return [
        reported(f"{label} / fp32 decode speed (batch 1)", rows[name]["decode_speedup"], "x",
                 note="; ".join(filter(None, [
                     f"{t.new_tokens} new tokens", f"{fraction_words(rows[name])}; fp32: "
                     f"{fraction_words(rows['float32'])}", emulated,
                     f"model {ctx.timed_model}", f"decode path: {t.path}"])),
                 busy=decode_busy),
        reported(f"{label} / fp32 prefill speed ({t.prompt_tokens}-token prompt)",
                 rows[name]["prefill_speedup"], "x", busy=prefill_busy,
                 note="; ".join(filter(None, [emulated, f"model {ctx.timed_model}"]))),
        reported(f"{name} top-1 agreement with fp32", rows[name]["top1_agreement"], "fraction",
                 note=f"max |logit difference| {rows[name]['max_abs_diff']:.3f}"),
    ]


def _speeds(ctx: BenchContext, models: dict, t: _Timings) -> dict:
    """Each 16-bit dtype's decode and prefill against fp32's, in full. Notebook 03 (mixed precision)."""
    return {regime: {name: {"speedup": timings["float32"].median / timings[name].median,
                            "seconds": timings[name].median,
                            "fp32_seconds": timings["float32"].median, "note": emulation_note(ctx.device, name),
                            "timing": timings[name].to_dict(), "fp32_timing": timings["float32"].to_dict()}
                     for name in models if name != "float32"}
            for regime, timings in (("decode", t.decode), ("prefill", t.prefill))}
