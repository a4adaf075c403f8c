"""Notebook 00's first section: labsupport's generate() against Hugging Face's, and the
bandwidth a decode step reaches (every peer, side by side, is in engines.py).

Introduced in notebook 00 (where the time goes); ``python -m labsupport bench --sections baseline``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..engine.kv_cache import kv_cache_bytes
from ..lab.measure import (HF_GRAPHED, WARMUP_TOKENS, mark_graphed, require_graphed, time_side_by_side,
                           timed_compile, track_peak_memory)
from ..lab.roofs import copy_bandwidth, copy_timing
from ..lab.workloads import DEFAULT_PROMPT
from .core import BenchContext, reported
from .options import SectionOptions, count
from .peers.huggingface import hf_generate_fn, hf_static_compiled_fn


@dataclass(frozen=True)
class BaselineOptions(SectionOptions):
    """The baseline section's options (the same on a CPU and a GPU). Introduced in notebook 00.

    new_tokens: new tokens per generate() call (fp32, greedy, batch 1); repeats: timed
    repeats of each candidate, interleaved."""

    SECTION = "baseline"
    new_tokens: int = count(128)
    repeats: int = count(3)


def section_baseline(ctx: BenchContext, options: BaselineOptions) -> dict:
    """labsupport generate() against Hugging Face generate(): same model, prompt and
    tokens; fp32, greedy, batch 1. Also the bandwidth a decode step reaches.

    Introduced in notebook 00 (where the time goes). The chapter's claim about it
    (small batches are memory-bound) is judged by the roofline section's sweep. On a GPU both
    are replayed CUDA graphs (`measure.timed_compile`): ours compiled + CUDA graphs, Hugging
    Face's static cache + torch.compile; each figure says the paths, compile time apart.
    """
    new_tokens, repeats = options.new_tokens, options.repeats
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))

    ours_out, hf_out = {}, {}
    graphed = timed_compile(ctx.device)
    hf_fn = hf_static_compiled_fn if graphed else hf_generate_fn
    paths = {"labsupport": set(), "huggingface": {HF_GRAPHED if graphed else "eager"}}
    warmup_s = []

    def run_ours(n):
        result = require_graphed(generate(model, ids, n, eos_token_ids=(), compile=graphed),
                                 "labsupport generate()", ctx.device)
        paths["labsupport"].add(result.decode_path)
        warmup_s.append(result.warmup_seconds)
        return result

    def ours():
        ours_out["result"] = run_ours(new_tokens)

    hf_run = hf_fn(hf, ids, new_tokens)

    def theirs():
        hf_out["tokens"] = hf_run()[0, len(ids):].tolist()

    # The copy probe runs in the same rounds, so the bandwidth a decode step is set against
    # was measured at the same moments as the step (a shared machine's bandwidth moves).
    nbytes, _ = copy_timing(ctx.device, repeats=1)
    source = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    destination = torch.empty_like(source)
    with track_peak_memory(ctx.device) as memory:
        hf_warmup = hf_fn(hf, ids, WARMUP_TOKENS)
        timings = time_side_by_side({"labsupport": ours, "huggingface": theirs,
                                     "copy": lambda: destination.copy_(source)}, ctx.device,
                                    warmup=1, repeats=repeats,
                                    warmup_fns={"labsupport": lambda: run_ours(WARMUP_TOKENS),
                                                "huggingface": hf_warmup})
    every_path = [p for ps in paths.values() for p in ps]
    busy = busy_reason(timings)                 # the load probe is the suite's (mark_busy)
    result = ours_out["result"]
    same_tokens = result.row(0) == hf_out["tokens"]
    ours_tps = new_tokens / timings["labsupport"].median
    hf_tps = new_tokens / timings["huggingface"].median

    # Bandwidth: bytes a decode step reads (every weight, and the cache at its mean length)
    # x decode steps per second, against the copy bandwidth of the same rounds.
    decode_tps = result.decode_tokens_per_s
    weight_bytes = model.weight_bytes()
    mean_context = len(ids) + new_tokens / 2
    kv_bytes = kv_cache_bytes(model.config, int(mean_context), 1, model.dtype)
    achieved = (weight_bytes + kv_bytes) * decode_tps
    copy_bw = copy_bandwidth(nbytes, timings["copy"].median)
    copy_spread = timings["copy"].spread / timings["copy"].median
    return {
        "prompt_tokens": len(ids), "new_tokens": new_tokens, "dtype": "float32", "batch": 1,
        "same_tokens_as_huggingface": same_tokens,
        "timings_s": {k: v.to_dict() for k, v in timings.items()},
        "tokens_per_s": {"labsupport": ours_tps, "huggingface": hf_tps},
        "decode_tokens_per_s": decode_tps,
        "weight_bytes_per_token": weight_bytes,
        "kv_cache_bytes_per_token_mean": kv_bytes,
        "bandwidth_achieved_bytes_per_s": achieved,
        "copy_bandwidth_bytes_per_s": copy_bw, "copy_bandwidth_spread": copy_spread,
        "probe_bandwidth_bytes_per_s": ctx.hardware.bandwidth,
        "peak_memory_bytes": memory.peak_bytes,
        "decode_paths": {name: sorted(p) for name, p in paths.items()}, "compile_s": sum(warmup_s),
        "figures": [
            mark_graphed(reported("labsupport generate / HF generate (fp32, greedy, batch 1)",
                                  ours_tps / hf_tps, "x", target=1.5, busy=busy,
                                  note=f"{ours_tps:.1f} vs {hf_tps:.1f} tokens/s, {new_tokens} new tokens; "
                                       f"same tokens: {same_tokens}"), every_path, ctx.device),
            mark_graphed(reported("decode bandwidth achieved / measured copy bandwidth", achieved / copy_bw,
                                  "fraction", target=0.6, busy=busy,
                                  note=f"({weight_bytes / 1e6:.0f} MB of weights + {kv_bytes / 1e6:.1f} MB of "
                                       f"cache) x {decode_tps:.1f} steps/s = {achieved / 1e9:.1f} GB/s of "
                                       f"{copy_bw / 1e9:.1f} GB/s (copies timed in the same rounds, spread "
                                       f"±{copy_spread / 2:.0%})"), paths["labsupport"], ctx.device),
        ],
    }
