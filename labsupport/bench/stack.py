"""Notebook 07's section: every technique stacked on one workload, against Hugging Face.

Introduced in notebook 07 (putting it together); ``python -m labsupport bench --sections stack``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.precision import tensor_bytes
from ..lab.busy import busy_reason
from ..lab.roofs import fraction_words
from ..lab.measure import mark_graphed
from ..lab.quality import eval_tokens
from ..lab.stack import HF_PEER, run_stack
from ..lab.serving_workload import stack_workload
from ..lab.workloads import PRESETS
from .core import BenchContext, reported
from .options import SectionOptions, count
from .peers.huggingface import hf_stack_stage


@dataclass(frozen=True)
class StackOptions(SectionOptions):
    """The stack section's options. Introduced in notebook 07 (putting it together).

    slots: batch slots of the batched stages; requests: requests in the workload
    (`serving_workload.stack_workload`; `workloads.PRESETS`' ``stack.requests``: 8 on a CPU,
    64 on a GPU); repeats: timed repeats of every stage."""

    SECTION = "stack"
    slots: int = count(8)
    requests: int = count(PRESETS["cpu"].stack.requests)
    repeats: int = count(1)

    @classmethod
    def gpu_sizes(cls) -> dict:
        return {"requests": PRESETS["gpu"].stack.requests}


def section_stack(ctx: BenchContext, options: StackOptions) -> dict:
    """The ladder of `stack.run_stack` with Hugging Face generate() as its peer; one figure per
    rung (its gain over the stage it builds on), the best stage over the naive loop and over
    Hugging Face. Its claims: `claims.stack.stack_section_claims` (the ladder and the model's
    bytes in fp32 and in 16 bits).

    Introduced in notebook 07 (putting it together). Every stage's model is a variant of the
    run (`BenchContext.variants`). Quality is teacher-forced top-1 agreement with fp32 on 256
    tokens of the evaluation text; a figure measured while the machine was busy carries the reason.
    """
    model, tok = ctx.model(torch.float32)
    requests = stack_workload(tok, ctx.device, options.requests)
    result = run_stack(model, requests, slots=options.slots,
                       peers=[hf_stack_stage(ctx.hf_model(torch.float32), requests)], variants=ctx.variants,
                       repeats=options.repeats, agreement_tokens=eval_tokens(tok, max_tokens=256),
                       bandwidth=ctx.hardware.bandwidth)
    rows = {r["stage"]: r for r in result["stages"]}

    def busy(*names):
        return busy_reason({n: rows[n]["timing"] for n in names if n in rows}, load=result["load"])

    def checked(figure, *names):
        """On a GPU a figure read from a stage that was not graphed is a failed measurement."""
        return mark_graphed(figure, [p for n in names if n in rows for p in rows[n]["decode_paths"]], ctx.device)

    figures = [checked(reported(f"stack: {r['stage']} / {r['builds_on']}", r["gain"], "x",
                                note=f"{r['tokens_per_s']:.1f} tokens/s, {r['precision']}"
                                     + (f"; top-1 agreement with fp32 {r['top1_agreement']:.0%}"
                                        if r["top1_agreement"] is not None else "")
                                     + ("" if r["kept"] else "; does not help here")
                                     + ("; " + fraction_words(ctx.hardware.bandwidth_fractions(
                                         r["bandwidth_fraction"] * ctx.hardware.bandwidth))   # the row's is of the copy
                                        if r["bandwidth_fraction"] is not None else ""),
                                busy=busy(r["stage"], r["builds_on"])), r["stage"], r["builds_on"])
               for r in result["stages"] if r["gain"] is not None]
    if result["best"] is not None:
        best = rows[result["best"]]
        figures.append(checked(reported("stack: best stage / naive loop", best["cumulative"], "x",
                                        note=result["best"], busy=busy(result["best"], "naive loop")),
                               result["best"], "naive loop"))
    if "stack_vs_hf" in result:
        figures.append(checked(reported("stack: best stage / Hugging Face generate()", result["stack_vs_hf"], "x",
                                        note="HF: fp32, one request at a time", busy=busy(result["best"], HF_PEER)),
                               result["best"], HF_PEER))
    result["model_bytes"] = model_bytes(model)
    result["figures"] = figures
    return result


def model_bytes(model) -> dict:
    """What the stack's memory claim compares: the model's tensors in fp32 ("fp32") and the same
    tensors at 2 bytes each ("half"). Introduced in notebook 07 (putting it together)."""
    return {"fp32": tensor_bytes(model),
            "half": sum(t.numel() * 2 for t in list(model.parameters()) + list(model.buffers()))}
