"""Notebook 07's section: every technique stacked on one workload, against Hugging Face.

Introduced in notebook 07 (putting it together); ``python -m labsupport bench --sections stack``.
"""

from __future__ import annotations

import torch

from ..claims import stack_claims
from ..stack import run_stack
from ..workloads import stack_workload
from .core import BenchContext, reported
from .options import BenchOptions
from .peers import hf_stack_stage


def section_stack(ctx: BenchContext, options: BenchOptions) -> dict:
    """The ladder of `stack.run_stack` with Hugging Face generate() as its peer; one figure per
    rung (its gain over the stage it builds on), the best stage over the naive loop and over
    Hugging Face, and the chapter's claims (`claims.stack_claims`).

    Introduced in notebook 07 (putting it together). Reads stack_slots, stack_requests and
    stack_repeats.
    """
    model, tok = ctx.model(torch.float32)
    requests = stack_workload(tok, ctx.device, options.stack_requests)
    result = run_stack(model, requests, slots=options.stack_slots,
                       peers=[hf_stack_stage(ctx.hf_model(torch.float32), requests)],
                       repeats=options.stack_repeats)
    figures = [reported(f"stack: {r['stage']} / {r['builds_on']}", r["gain"], "x",
                        note=f"{r['tokens_per_s']:.1f} tokens/s, {r['precision']}; "
                             f"{r['same_tokens_as_fp32']:.0%} of tokens equal fp32's"
                             + ("" if r["kept"] else "; does not pay here"))
               for r in result["stages"] if r["gain"] is not None]
    best = next(r for r in result["stages"] if r["stage"] == result["best"])
    figures.append(reported("stack: best stage / naive loop", best["cumulative"], "x", note=result["best"]))
    if "stack_vs_hf" in result:
        figures.append(reported("stack: best stage / Hugging Face generate()", result["stack_vs_hf"], "x",
                                claim="production serving systems combine all of them",
                                note="HF: fp32, one request at a time"))
    result["claims"] = stack_claims(result, model)
    result["figures"] = figures
    return result
