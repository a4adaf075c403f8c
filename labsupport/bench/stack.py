"""Notebook 07's section: every technique stacked on one workload, against Hugging Face.

Introduced in notebook 07 (putting it together); ``python -m labsupport bench --sections stack``.
"""

from __future__ import annotations

import torch

from ..lab.busy import busy_reason
from ..claims import stack_claims
from ..lab.quality import eval_tokens
from ..lab.stack import HF_PEER, run_stack
from ..lab.workloads import stack_workload
from .core import BenchContext, reported
from .options import BenchOptions
from .peers import hf_stack_stage


def section_stack(ctx: BenchContext, options: BenchOptions) -> dict:
    """The ladder of `stack.run_stack` with Hugging Face generate() as its peer; one figure per
    rung (its gain over the stage it builds on), the best stage over the naive loop and over
    Hugging Face, and the chapter's claims (`claims.stack_claims`).

    Introduced in notebook 07 (putting it together). Reads stack_slots, stack_requests and
    stack_repeats. Quality is teacher-forced top-1 agreement with fp32 on 256 tokens of the
    evaluation text; a figure measured while the machine was busy carries the reason.
    """
    model, tok = ctx.model(torch.float32)
    requests = stack_workload(tok, ctx.device, options.stack_requests)
    result = run_stack(model, requests, slots=options.stack_slots,
                       peers=[hf_stack_stage(ctx.hf_model(torch.float32), requests)],
                       repeats=options.stack_repeats, agreement_tokens=eval_tokens(tok, max_tokens=256),
                       bandwidth=ctx.hardware.bandwidth)
    rows = {r["stage"]: r for r in result["stages"]}

    def busy(*names):
        return busy_reason({n: rows[n]["timing"] for n in names if n in rows}, load=result["load"])

    figures = [reported(f"stack: {r['stage']} / {r['builds_on']}", r["gain"], "x",
                        note=f"{r['tokens_per_s']:.1f} tokens/s, {r['precision']}"
                             + (f"; top-1 agreement with fp32 {r['top1_agreement']:.0%}"
                                if r["top1_agreement"] is not None else "")
                             + ("" if r["kept"] else "; does not pay here")
                             + (f"; {r['bandwidth_fraction']:.0%} of copy bandwidth"
                                if r["bandwidth_fraction"] is not None else ""),
                        busy=busy(r["stage"], r["builds_on"]))
               for r in result["stages"] if r["gain"] is not None]
    if result["best"] is not None:
        best = rows[result["best"]]
        figures.append(reported("stack: best stage / naive loop", best["cumulative"], "x", note=result["best"],
                                busy=busy(result["best"], "naive loop")))
    if "stack_vs_hf" in result:
        figures.append(reported("stack: best stage / Hugging Face generate()", result["stack_vs_hf"], "x",
                                claim="production serving systems combine all of them",
                                note="HF: fp32, one request at a time", busy=busy(result["best"], HF_PEER)))
    result["claims"] = stack_claims(result, model)
    result["figures"] = figures
    return result
