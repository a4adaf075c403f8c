"""Notebook 06's section: static against continuous batching at equal slots, and against
Hugging Face's continuous batching, on one long-tailed workload.

Introduced in notebook 06 (continuous batching); ``python -m labsupport bench --sections serving``.
"""

from __future__ import annotations

import torch

from ..measure import time_side_by_side
from ..serving.engine import Engine
from ..serving.metrics import reserved_vs_used
from ..serving.workload import chat_prompts, make_workload
from .core import BenchContext, reported
from .options import BenchOptions
from .peers import hf_serve


def serving_workload(tokenizer, device, count: int | None = None, rate: float | None = None, seed: int = 0):
    """The course's long-tailed workload: chat prompts, log-normal answer lengths (median 16,
    sigma 1.0, at most 256 tokens); `count` requests, by default the device's preset
    (`BenchOptions.serving_requests`: 48 on a CPU, 256 on a GPU).

    Introduced in notebook 06 (continuous batching)."""
    if count is None:
        count = BenchOptions.for_device(device).serving_requests
    return make_workload(chat_prompts(tokenizer, count), rate=rate, median_new_tokens=16, sigma=1.0,
                         max_new_tokens=256, seed=seed)


def default_slots(device) -> int:
    """Batch slots, the device's preset (`BenchOptions.serving_slots`): 8 on a CPU (two cores
    saturate early, notebook 02), 64 on a GPU.

    Introduced in notebook 06 (continuous batching)."""
    return BenchOptions.for_device(device).serving_slots


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
    runs: dict = {}

    def ours(policy):
        def fn():
            runs[policy] = Engine(model, max_slots=slots, policy=policy, cache_tokens=slots * longest).run(requests)
        return fn

    def huggingface():
        runs["hf"] = hf_serve(hf, requests, max_slots=slots)

    timings = time_side_by_side({"continuous": ours("continuous"), "static": ours("static"),
                                 "hf": huggingface}, ctx.device, warmup=0, repeats=repeats)
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
                      f"vs {metrics['static']['slot_utilization']:.0%}; same tokens: {same_tokens}"),
        reported("serving: ours / Hugging Face continuous batching", speed["continuous"] / speed["hf"], "x",
                 target=1.0, note=f"same tokens as HF: {same_as_hf}"),
        reported("serving: latency p99, static / continuous",
                 metrics["static"]["latency_p99"] / metrics["continuous"]["latency_p99"], "x"),
        reported("serving: paged cache peak / per-slot reservation", memory["used_bytes"] / memory["reserved_bytes"],
                 "fraction", note=f"{memory['used_bytes'] / 2**20:.1f} MiB used vs "
                                  f"{memory['reserved_bytes'] / 2**20:.1f} MiB reserved for {slots} x {longest} "
                                  f"positions"),
    ]
    return {"requests": len(requests), "slots": slots, "tokens": tokens, "answer_lengths": lengths,
            "tokens_per_s": speed, "timings_s": {k: t.to_dict() for k, t in timings.items()},
            "metrics": metrics, "same_tokens_static_continuous": same_tokens, "same_tokens_as_hf": same_as_hf,
            "memory": memory, "figures": figures}
