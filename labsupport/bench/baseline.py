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
from ..lab.measure import (WARMUP_TOKENS, mark_graphed, require_graphed, time_side_by_side,
                           timed_compile, track_peak_memory)
from ..lab.roofs import copy_bandwidth, copy_timing, read_bandwidth
from ..lab.workloads import DEFAULT_PROMPT
from .core import BenchContext, GraphCount, reported
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


@dataclass
class _SideBySide:
    """What the side-by-side rounds measured, and their last runs. Notebook 00 (where the time goes)."""

    timings: dict                   # "labsupport", "huggingface", "copy", "read" -> Timing
    result: object                  # our last `GenerationResult`
    hf_tokens: list[int]            # Hugging Face's last new tokens
    paths: dict                     # name -> the decode paths its runs took
    warmup_s: list[float]           # our compile/capture seconds, one per run
    memory: object                  # `track_peak_memory`'s `PeakMemory`
    copy_bytes: int                 # bytes of one copy of the probe


def section_baseline(ctx: BenchContext, options: BaselineOptions) -> dict:
    """labsupport generate() against Hugging Face generate(): same model, prompt and
    tokens; fp32, greedy, batch 1. Also the bandwidth a decode step reaches.

    Introduced in notebook 00 (where the time goes). The chapter's claim about it
    (small batches are memory-bound) is judged by the roofline section's sweep. On a GPU both
    are replayed CUDA graphs (`measure.timed_compile`): ours compiled + CUDA graphs, Hugging
    Face's static cache + torch.compile; each figure says the paths, compile time apart.
    """
    new_tokens = options.new_tokens
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))
    side = _time_side_by_side(ctx, model, hf, ids, options)
    timings, paths = side.timings, side.paths
    every_path = [p for ps in paths.values() for p in ps]
    busy = busy_reason(timings)                 # the load probe is the suite's (mark_busy)
    same_tokens = side.result.row(0) == side.hf_tokens
    ours_tps = new_tokens / timings["labsupport"].median
    hf_tps = new_tokens / timings["huggingface"].median
    bw = _bandwidth(model, len(ids), new_tokens, side)
    return {
        "prompt_tokens": len(ids), "new_tokens": new_tokens, "dtype": "float32", "batch": 1,
        "same_tokens_as_huggingface": same_tokens,
        "timings_s": {k: v.to_dict() for k, v in timings.items()},
        "tokens_per_s": {"labsupport": ours_tps, "huggingface": hf_tps},
        **bw,
        "probe_bandwidth_bytes_per_s": ctx.hardware.bandwidth,
        "peak_memory_bytes": side.memory.peak_bytes,
        "decode_paths": {name: sorted(p) for name, p in paths.items()}, "compile_s": sum(side.warmup_s),
        "figures": [
            mark_graphed(reported("labsupport generate / HF generate (fp32, greedy, batch 1)",
                                  ours_tps / hf_tps, "x", target=1.5, busy=busy,
                                  note=f"{ours_tps:.1f} vs {hf_tps:.1f} tokens/s, {new_tokens} new tokens; "
                                       f"same tokens: {same_tokens}"), every_path, ctx.device),
            mark_graphed(_bandwidth_figure(bw, busy), paths["labsupport"], ctx.device),
            mark_graphed(_read_bandwidth_figure(bw, busy), paths["labsupport"], ctx.device),
        ],
    }


def _time_side_by_side(ctx: BenchContext, model, hf, ids: list[int], options: BaselineOptions) -> _SideBySide:
    """Ours, Hugging Face's, a memory copy and a read, timed in the same rounds. Notebook 00 (where the time goes)."""
    new_tokens = options.new_tokens
    ours_out, hf_out = {}, {}
    graphed = timed_compile(ctx.device)
    hf_fn = hf_static_compiled_fn if graphed else hf_generate_fn
    paths = {"labsupport": set(), "huggingface": set()}
    hf_count = GraphCount()                   # around HF's first (compiling) run: its path as torch counted it
    warmup_s = []

    def run_ours(n):
        result = require_graphed(generate(model, ids, n, eos_token_ids=(), compile=graphed),
                                 "labsupport generate()", ctx.device)
        paths["labsupport"].add(result.decode_path)
        warmup_s.append(result.warmup_seconds)
        return result

    def ours():
        ours_out["result"] = run_ours(new_tokens)

    hf_run = hf_count.first_call(hf_fn(hf, ids, new_tokens))

    def theirs():
        hf_out["tokens"] = hf_run()[0, len(ids):].tolist()
        paths["huggingface"] = {hf_count.hf_path(graphed)}

    # The copy and read probes run in the same rounds, so the bandwidth a decode step is set against
    # was measured at the same moments as the step (a shared machine's bandwidth moves).
    nbytes, _ = copy_timing(ctx.device, repeats=1)
    source = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    destination = torch.empty_like(source)
    values = source.view(torch.float32)           # the same bytes, read as float32 (normal numbers)
    with track_peak_memory(ctx.device) as memory:
        hf_warmup = hf_fn(hf, ids, WARMUP_TOKENS)
        timings = time_side_by_side({"labsupport": ours, "huggingface": theirs,
                                     "copy": lambda: destination.copy_(source), "read": values.sum}, ctx.device,
                                    warmup=1, repeats=options.repeats,
                                    warmup_fns={"labsupport": lambda: run_ours(WARMUP_TOKENS),
                                                "huggingface": hf_warmup})
    return _SideBySide(timings, ours_out["result"], hf_out["tokens"], paths, warmup_s, memory, nbytes)


def _bandwidth(model, prompt_tokens: int, new_tokens: int, side: _SideBySide) -> dict:
    """The bandwidth a decode step reached, against the copies and reads of the same rounds. Notebook 00 (where the time goes)."""
    # Bandwidth: bytes a decode step reads (every weight, and the cache at its mean length)
    # x decode steps per second, against the read and copy bandwidths of the same rounds.
    decode_tps = side.result.decode_tokens_per_s
    weight_bytes = model.weight_bytes()
    mean_context = prompt_tokens + new_tokens / 2
    kv_bytes = kv_cache_bytes(model.config, int(mean_context), 1, model.dtype)
    achieved = (weight_bytes + kv_bytes) * decode_tps
    copy = side.timings["copy"]
    return {"decode_tokens_per_s": decode_tps,
            "weight_bytes_per_token": weight_bytes,
            "kv_cache_bytes_per_token_mean": kv_bytes,
            "bandwidth_achieved_bytes_per_s": achieved,
            "copy_bandwidth_bytes_per_s": copy_bandwidth(side.copy_bytes, copy.median),
            "copy_bandwidth_spread": copy.spread / copy.median,
            "read_bandwidth_bytes_per_s": read_bandwidth(side.copy_bytes, side.timings["read"].median)}


def _bandwidth_figure(bw: dict, busy: str | None) -> dict:
    """Decode bandwidth achieved as a fraction of the measured copy bandwidth. Notebook 00 (where the time goes)."""
    achieved, copy_bw = bw["bandwidth_achieved_bytes_per_s"], bw["copy_bandwidth_bytes_per_s"]
    return reported("decode bandwidth achieved / measured copy bandwidth", achieved / copy_bw,
                    "fraction", target=0.6, busy=busy,
                    note=f"({bw['weight_bytes_per_token'] / 1e6:.0f} MB of weights + "
                         f"{bw['kv_cache_bytes_per_token_mean'] / 1e6:.1f} MB of cache) x "
                         f"{bw['decode_tokens_per_s']:.1f} steps/s = {achieved / 1e9:.1f} GB/s of "
                         f"{copy_bw / 1e9:.1f} GB/s (copies timed in the same rounds, spread "
                         f"±{bw['copy_bandwidth_spread'] / 2:.0%})")


def _read_bandwidth_figure(bw: dict, busy: str | None) -> dict:
    """Decode bandwidth achieved as a fraction of the read probe's (a sum that writes nothing), the
    limit of a step that only reads (issue 54: target 0.9 in fp32). Notebook 00 (where the time goes)."""
    achieved, read = bw["bandwidth_achieved_bytes_per_s"], bw["read_bandwidth_bytes_per_s"]
    return reported("decode bandwidth achieved / measured read bandwidth", achieved / read, "fraction",
                    target=0.9, busy=busy,
                    note=f"{achieved / 1e9:.1f} GB/s of {read / 1e9:.1f} GB/s read (reads timed in the same "
                         f"rounds; {achieved / bw['copy_bandwidth_bytes_per_s']:.0%} of the copy's "
                         f"{bw['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
