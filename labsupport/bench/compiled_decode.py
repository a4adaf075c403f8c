"""Does compiling the decode step pay here? Eager against compiled decode, per precision and batch.

Introduced in notebook 07 (putting it together); ``python -m labsupport bench --sections compile``.
Not in the default run (each compile takes a minute or two on a 2-core CPU): name it.

A small model's decode step is partly overhead: Python, the framework's dispatch, one
kernel launch per operation (notebook 00's profile). `generate(compile=True)` runs the
step through torch.compile (`engine.compiled.CompiledDecoder`): inductor fuses the elementwise
work and, on a GPU, replays the whole step as one CUDA graph. For each precision of
`options.rows` and each batch of `options.batches` this section times
eager and compiled `generate()` side by side, and reports the warm-up (compile) seconds
and how many tokens a generation needs before compiling has paid for itself. On a CPU it
also tries inductor's options (`CPU_VARIANTS`: freezing the weights into the graph, a C++
wrapper, max-autotune) on fp32 at the first batch size.
"""

from __future__ import annotations

import copy

import torch

from ..lab.busy import busy_reason
from ..engine.compiled import SHARED, CompiledDecoder
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..engine.hardware import bf16_supported
from ..errors import LabError
from ..lab.measure import require_graphed, time_side_by_side
from ..engine.quant import quantize_model
from ..lab.workloads import DEFAULT_PROMPT
from .core import BenchContext, reported
from .compile_options import CompileOptions


def _model_for(ctx: BenchContext, row: str):
    """A fresh model for one row: "fp32", "bf16" (a cast copy), "int8" or "int4" (groups of 32)."""
    if row == "bf16":
        return copy.deepcopy(ctx.model(torch.bfloat16)[0])
    model = copy.deepcopy(ctx.model(torch.float32)[0])
    if row in ("int8", "int4"):
        quantize_model(model, row, group_size=32)
    return model


def compare_compiled(model, prompts: list[list[int]], new_tokens: int, device, repeats: int,
                     decoder: CompiledDecoder = SHARED) -> dict | str:
    """Eager and compiled `generate()` of `prompts` timed side by side: decode tokens/s of
    each (all rows), the warm-up seconds, the decode steps that pay the warm-up back, same
    tokens, what the compiled runs ran on (`decode_path`), the timings and the busy reason.
    A string (one sentence) where compiling fails. decoder: the `CompiledDecoder` to use.

    Introduced in notebook 07 (putting it together)."""
    batch = len(prompts)
    warm = generate(model, prompts, new_tokens, eos_token_ids=(), compile=decoder)
    if warm.decode_path == "eager":
        return warm.decode_note or "the decode steps were not compiled here."
    try:               # on a GPU the compiled contender is a replayed CUDA graph, or a failed measurement
        require_graphed(warm, "the compiled decode", device)
    except LabError as error:
        return str(error)
    out = {}

    def run(compiled: bool, key: str):
        def call():
            out[key] = generate(model, prompts, new_tokens, eos_token_ids=(), compile=decoder if compiled else False)
        return call

    timings = time_side_by_side({"eager": run(False, "eager"), "compiled": run(True, "compiled")},
                                device, warmup=1, repeats=repeats)
    eager_tps, compiled_tps = (out[k].decode_tokens_per_s for k in ("eager", "compiled"))   # all rows
    saved_per_step = batch / eager_tps - batch / compiled_tps          # seconds per decode step
    return {"batch": batch, "eager_decode_tokens_per_s": eager_tps, "compiled_decode_tokens_per_s": compiled_tps,
            "warmup_s": warm.warmup_seconds, "decode_path": out["compiled"].decode_path,
            "payback_steps": warm.warmup_seconds / saved_per_step if saved_per_step > 0 else float("inf"),
            "same_tokens": torch.equal(out["eager"].tokens, out["compiled"].tokens),
            "timings_s": {k: v.to_dict() for k, v in timings.items()}, "busy": busy_reason(timings)}


def section_compile(ctx: BenchContext, options: CompileOptions) -> dict:
    """Eager vs compiled decode for every (precision, batch) of the options.

    Introduced in notebook 07 (putting it together). Its options: `CompileOptions`."""
    _, tok = ctx.model(torch.float32)
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))
    new_tokens = options.new_tokens
    rows, skipped, figures = [], {}, []
    for row in options.rows:
        if row == "bf16" and not bf16_supported(ctx.device):
            skipped[row] = "this device has no bfloat16 arithmetic (notebook 03)"
            continue
        model = _model_for(ctx, row)
        for batch in options.batches:
            record = compare_compiled(model, [ids] * batch, new_tokens, ctx.device, options.repeats)
            if isinstance(record, str):
                skipped[f"{row} batch {batch}"] = record
                break
            rows.append({"row": row, **record})
            payback = record["payback_steps"]
            figures.append(reported(
                f"compiled / eager decode, {row}, batch {batch}",
                record["compiled_decode_tokens_per_s"] / record["eager_decode_tokens_per_s"], "x",
                busy=record["busy"],
                note=f"{record['compiled_decode_tokens_per_s']:.1f} vs {record['eager_decode_tokens_per_s']:.1f} "
                     f"tokens/s; eager against {record['decode_path']}, side by side (the lesson: launches); "
                     f"warm-up {record['warmup_s']:.0f} s, apart from the timed seconds, "
                     + (f"won back after {payback:.0f} decode steps" if payback != float("inf")
                        else "never won back") + f"; same tokens: {record['same_tokens']}"))
    variants = _inductor_variants(ctx, options, [ids] * options.batches[0], figures)
    return {"new_tokens": new_tokens, "prompt_tokens": len(ids), "rows": rows, "skipped": skipped,
            "inductor_variants": variants, "figures": figures}


# Inductor's CPU options worth trying on a decode step (torch._inductor.config names).
CPU_VARIANTS = {"freezing": {"freezing": True},
                "freezing + C++ wrapper": {"freezing": True, "cpp_wrapper": True},
                "max-autotune": {"max_autotune": True}}


def _inductor_variants(ctx: BenchContext, options: CompileOptions, prompts, figures: list) -> list[dict]:
    """On a CPU, fp32 at the first batch size: each of CPU_VARIANTS against eager (its own
    fresh model, so each compiles from scratch). Appends one figure per variant."""
    if ctx.device.type != "cpu" or not options.inductor_variants:
        return []
    out = []
    for name, inductor in CPU_VARIANTS.items():
        model = _model_for(ctx, "fp32")
        record = compare_compiled(model, prompts, options.new_tokens, ctx.device, options.repeats,
                                  CompiledDecoder(inductor_options=inductor))
        if isinstance(record, str):
            out.append({"variant": name, "skipped": record})
            continue
        out.append({"variant": name, **record})
        figures.append(reported(
            f"compiled ({name}) / eager decode, fp32, batch {len(prompts)}",
            record["compiled_decode_tokens_per_s"] / record["eager_decode_tokens_per_s"], "x", busy=record["busy"],
            note=f"warm-up {record['warmup_s']:.0f} s; same tokens: {record['same_tokens']}"))
    return out
