"""Notebook 10's section (``tensor_parallel``, only when named): tensor parallelism on this
machine's cores, TP=1 against TP=2, and the all-reduce it pays; then disaggregated prefill and
decode against one colocated engine, by goodput (`lab.tensor_parallel_disaggregated`).

Introduced in notebook 10 (past one device); ``python -m labsupport bench --sections tensor_parallel``.
Each degree runs in its own processes over 127.0.0.1 (`engine.parallel`: gloo on a CPU, NCCL
with one GPU per rank), on the same cores, in rotated rounds (`lab.tensor_parallel`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason, load_per_core
from ..lab.tensor_parallel import link_arithmetic, measure_tensor_parallel
from .core import BenchContext, reported
from .options import SectionOptions, count, counts


@dataclass(frozen=True)
class TensorParallelOptions(SectionOptions):
    """The tensor-parallel section's options. Introduced in notebook 10 (past one device).

    degrees: the tensor-parallel degrees, side by side (each must divide the cores, or fit the
    GPUs); decode_tokens: decode steps timed at batch 1; prefill_tokens: the long prefill's
    length; rounds: rotated rounds (each figure is their median); disaggregation_rates: the
    Poisson arrival rates (requests/s) of the disaggregated-against-colocated comparison, each
    with `disaggregation_requests` chat requests (on this machine's CPU cores, two of them)."""

    SECTION = "tensor_parallel"
    degrees: tuple[int, ...] = counts((1, 2))
    decode_tokens: int = count(32)
    prefill_tokens: int = count(512)
    rounds: int = count(3)
    disaggregation_rates: tuple[int, ...] = counts((1, 3))
    disaggregation_requests: int = count(12)


def section_tensor_parallel(ctx: BenchContext, options: TensorParallelOptions) -> dict:
    """TP=1 against TP=2 (`options.degrees`): decode tokens/s at batch 1 and one long prefill,
    the all-reduces per step and their share of the step, the all-reduce alone, and the same
    all-reduces over data-sheet NVLink and PCIe links.

    Introduced in notebook 10 (past one device). On a machine with fewer GPUs than a degree
    asks, that degree is left out and the section says why."""
    model, tokenizer = ctx.model(torch.float32)
    prompt = tokenizer.encode("Explain, step by step, why the sky is blue during the day and red at sunset.")
    if model.device.type == "cuda":
        units, unit = torch.cuda.device_count(), "GPU(s)"
        cores = 1
    else:
        units, unit = os.cpu_count() or 1, "core(s)"
        cores = units
    degrees = tuple(d for d in options.degrees if d <= units and (model.device.type == "cuda" or cores % d == 0))
    left_out = [d for d in options.degrees if d not in degrees]
    out = {"device": str(model.device), "units": units, "left_out": left_out,
           "left_out_note": (f"degree(s) {left_out} left out: this machine has {units} {unit}, and each rank "
                             f"needs its own share" if left_out else None)}
    if len(degrees) < 2:
        out.update(result=None, figures=[], links=[])
        return out
    result = measure_tensor_parallel(model, prompt, degrees=degrees, cores=cores, new_tokens=options.decode_tokens,
                                     prefill_tokens=options.prefill_tokens, rounds=options.rounds)
    busy = busy_reason({}, load=load_per_core())
    base, figures = result["degrees"][degrees[0]], []
    for world in degrees[1:]:
        d = result["degrees"][world]
        figures += [
            reported(f"decode at batch 1, TP={world} / TP={degrees[0]}", d["decode_tokens_per_s"] /
                     base["decode_tokens_per_s"], "x", note=f"{d['decode_tokens_per_s']:.1f} against "
                     f"{base['decode_tokens_per_s']:.1f} tokens/s", busy=busy),
            reported(f"prefill of {options.prefill_tokens} tokens, TP={world} / TP={degrees[0]} (speed)",
                     base["prefill_s"] / d["prefill_s"], "x", note=f"{d['prefill_s']:.3f} against "
                     f"{base['prefill_s']:.3f} s", busy=busy),
            reported(f"time inside the all-reduces, TP={world}, share of a decode step",
                     d["all_reduce_share_of_decode"], "fraction", higher_is_better=False,
                     note=f"{d['all_reduces_per_step']:.0f} per step; latency plus waiting for the slowest rank",
                     busy=busy),
            reported(f"time inside the all-reduces, TP={world}, share of the prefill",
                     d["all_reduce_share_of_prefill"], "fraction", higher_is_better=False, busy=busy),
        ]
    out.update(result=result, figures=figures, links=link_arithmetic(result, model.config), load=load_per_core())
    out.update(_disaggregation(ctx, options, tokenizer))
    out["figures"] += out.pop("disaggregation_figures", [])
    return out


def _disaggregation(ctx: BenchContext, options: TensorParallelOptions, tokenizer) -> dict:
    """Disaggregated prefill and decode against one colocated engine, at each rate, on two CPU cores."""
    from ..lab.tensor_parallel_disaggregated import compare_with_colocated
    from ..lab.serving_workload import chat_prompts, make_workload
    if (os.cpu_count() or 1) < 2:
        return {"disaggregation": None, "disaggregation_note": "disaggregation left out: it needs two CPU cores"}
    model = ctx.model(torch.float32)[0]
    if model.device.type != "cpu":
        return {"disaggregation": None, "disaggregation_note": "disaggregation runs on the CPU cores only"}
    comparisons, figures = {}, []
    for rate in options.disaggregation_rates:
        trace = make_workload(chat_prompts(tokenizer, options.disaggregation_requests), rate=float(rate),
                              median_new_tokens=12, sigma=0.5, max_new_tokens=24, seed=0)
        c = compare_with_colocated(model, trace, slots=4, token_budget=32, ttft_slo=1.0, tpot_slo=0.15, cores=2)
        comparisons[rate] = {k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) else v)
                             for k, v in c.items()}
        busy = busy_reason({}, load=load_per_core())
        split, together = c["disaggregated"], c["colocated"]
        figures.append(reported(f"goodput at {rate} requests/s, disaggregated / colocated",
                                split["goodput"] / together["goodput"] if together["goodput"] else float("nan"), "x",
                                note=f"{split['goodput']:.2f} against {together['goodput']:.2f} requests/s; TTFT <= 1 s, "
                                     f"TPOT <= 0.15 s; same tokens: {c['same_tokens']}", busy=busy))
    return {"disaggregation": comparisons, "disaggregation_figures": figures}
