"""Notebook 06's section: static against continuous batching at equal slots, and against
Hugging Face's continuous batching, on one long-tailed workload.

Introduced in notebook 06 (continuous batching); ``python -m labsupport bench --sections serving``.
"""

from __future__ import annotations

import torch

from ..busy import busy_reason, load_per_core
from ..measure import time_side_by_side
from ..serving.engine import Engine
from ..serving.metrics import reserved_vs_used
from ..workloads import preset, serving_workload
from .core import BenchContext, reported
from .options import BenchOptions
from .serving_peers import hf_serve


def default_slots(device) -> int:
    """Batch slots, the device's preset (`workloads.PRESETS`, ``serving_slots``): 8 on a CPU
    (two cores saturate early, notebook 02), 64 on a GPU. The requests: `workloads.serving_workload`.

    Introduced in notebook 06 (continuous batching)."""
    return preset(device).serving_slots


def serve_side_by_side(model, hf_model, requests: list, slots: int, repeats: int = 1) -> tuple[dict, dict]:
    """Serve `requests` (all arriving at once) three ways, timed side by side: our engine with
    continuous and with static batching (`slots` slots, a paged cache the size of a per-slot
    reservation for the longest request) and Hugging Face's continuous batching (`serving_peers.hf_serve`).

    Introduced in notebook 06 (continuous batching). Returns (the `Timing` of "continuous",
    "static" and "hf", the last run of each by the same names: a `ServingResult` for ours,
    `hf_serve`'s dict for "hf").
    """
    longest = max(r.max_length for r in requests)
    runs: dict = {}

    def ours(policy):
        def fn():
            runs[policy] = Engine(model, max_slots=slots, policy=policy, cache_tokens=slots * longest).run(requests)
        return fn

    def huggingface():
        runs["hf"] = hf_serve(hf_model, requests, max_slots=slots)

    timings = time_side_by_side({"continuous": ours("continuous"), "static": ours("static"),
                                 "hf": huggingface}, model.device, warmup=0, repeats=repeats)
    return timings, runs


def section_serving(ctx: BenchContext, options: BenchOptions) -> dict:
    """All requests arrive at once; each server runs the whole workload, side by side.
    Figures: continuous / static throughput (same slots, same paged cache), ours / HF
    `generate_batch`-style continuous batching, latency percentiles, paged cache memory.

    Introduced in notebook 06 (continuous batching). Reads serving_slots,
    serving_requests and serving_repeats.
    """
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    slots = options.serving_slots
    requests = serving_workload(tok, ctx.device, options.serving_requests)
    repeats = options.serving_repeats
    longest = max(r.max_length for r in requests)
    timings, runs = serve_side_by_side(model, hf, requests, slots, repeats)
    load = load_per_core()

    def busy(*names):
        return busy_reason({n: timings[n] for n in names}, load=load)

    tokens = sum(r.max_new_tokens for r in requests)
    speed = {name: tokens / t.median for name, t in timings.items()}
    metrics = {policy: runs[policy].metrics() for policy in ("continuous", "static")}
    same_tokens = runs["continuous"].tokens() == runs["static"].tokens()
    same_as_hf = runs["continuous"].tokens() == runs["hf"]["tokens"]
    memory = reserved_vs_used(runs["continuous"], max_length=longest)
    lengths = [r.max_new_tokens for r in requests]
    figures = [
        reported("serving: continuous / static batching throughput", speed["continuous"] / speed["static"], "x",
                 target=2.0, claim="continuous batching frees slots as soon as a response ends",
                 note=f"{len(requests)} requests, {slots} slots, answer lengths {min(lengths)}-{max(lengths)} "
                      f"(median {sorted(lengths)[len(lengths) // 2]}); slot use "
                      f"{metrics['continuous']['slot_utilization']:.0%} "
                      f"vs {metrics['static']['slot_utilization']:.0%}; same tokens: {same_tokens}",
                 busy=busy("continuous", "static")),
        reported("serving: ours / Hugging Face continuous batching", speed["continuous"] / speed["hf"], "x",
                 target=1.0, note=f"same tokens as HF: {same_as_hf}", busy=busy("continuous", "hf")),
        reported("serving: latency p99, static / continuous",
                 metrics["static"]["latency_p99"] / metrics["continuous"]["latency_p99"], "x",
                 busy=busy("continuous", "static")),
        reported("serving: time to first token p99, static / continuous",
                 metrics["static"]["ttft_p99"] / metrics["continuous"]["ttft_p99"], "x",
                 note=f"p50 {metrics['continuous']['ttft_p50']:.2f} s continuous vs "
                      f"{metrics['static']['ttft_p50']:.2f} s static", busy=busy("continuous", "static")),
        reported("serving: paged cache peak / per-slot reservation", memory["used_bytes"] / memory["reserved_bytes"],
                 "fraction", note=f"{memory['used_bytes'] / 2**20:.1f} MiB used vs "
                                  f"{memory['reserved_bytes'] / 2**20:.1f} MiB reserved for {slots} x {longest} "
                                  f"positions"),
    ]
    return {"requests": len(requests), "slots": slots, "tokens": tokens, "answer_lengths": lengths,
            "tokens_per_s": speed, "timings_s": {k: t.to_dict() for k, t in timings.items()},
            "metrics": metrics, "same_tokens_static_continuous": same_tokens, "same_tokens_as_hf": same_as_hf,
            "memory": memory, "load": load, "figures": figures}
