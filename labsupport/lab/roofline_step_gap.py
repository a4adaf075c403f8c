"""Why a batch-1 decode step is slower than reading its bytes: the gap, measured part by part.

Introduced in notebook 00 (where the time goes) for float32; notebook 04 (quantization) runs it
again on the int4 model.

A memory-bound step could take as little as the time it takes to read its bytes once (its weights,
output head included, and its KV cache) at the machine's read bandwidth: the *floor*. The measured
step is longer. `decode_gap` splits it into parts that add up to the step:

* reading the bytes: the floor itself, bytes / the read bandwidth measured beside the step;
* matmul kernels past their bytes: the weight matmuls' own time (the profiler's self time) less
  the floor of the weights they read and less their thread wake-ups;
* thread wake-ups: each matmul call wakes torch's threads for one parallel region and joins them
  again; `roofs.fork_join_seconds` measures one such region, times the matmul calls per step;
* other kernels past the cache's bytes: attention, norms, rotation, sampling and the rest of the
  computing operators, less the floor of the KV cache that attention reads;
* Python and dispatch: the step's time that no operator accounts for (the framework deciding
  what to call, the modules' Python code).

The profiler slows every operator a little; that lands in the operators' parts, so "Python and
dispatch" is if anything an underestimate. A part that comes out below zero (the kernels ran
faster than the floor says, within noise) is shown as zero.
"""

from __future__ import annotations

import torch

from ..engine.kv_cache import kv_cache_bytes
from ..errors import LabError
from ..inputs import whole_number
from .roofline_step_profile import profile_decode_step
from .roofs import fork_join_seconds, read_bandwidth, read_timing

PARTS = ("reading the bytes", "matmul kernels past their bytes", "thread wake-ups",
         "other kernels past the cache's bytes", "Python and dispatch")


@torch.inference_mode()
def decode_gap(model, context: int = 64, steps: int = 5) -> dict:
    """Split one batch-1 decode step of `model` after `context` cached tokens into `PARTS`.

    Introduced in notebook 00 (where the time goes). Returns a dict with: step_seconds (the step's
    median, without the profiler), parts ({part: seconds per step}, in the order of `PARTS`: they add
    up to step_seconds, unless the operators' own times under the profiler already exceed it, when
    "Python and dispatch" is 0 and the sum is larger), read_bandwidth (bytes/s, measured with the step), bytes (read per step),
    fraction (the floor over the step: the step's share of the read bandwidth), layers,
    matmul_seconds_per_layer and matmul_floor_per_layer (the weight matmuls of one layer, the
    output head's share included, measured and at the read bandwidth), matmul_calls (per step),
    fork_join_seconds (one parallel region's wake-up and join), and profile (the profile itself).
    """
    context = whole_number(context, "context (the positions already cached)", minimum=0,
                           maximum=model.config.max_position - 1)
    steps = whole_number(steps, "steps (the profiled decode steps)")
    if model.device.type != "cpu":
        raise LabError(f"decode_gap splits a CPU step (its wake-ups are torch's CPU threads); this model is on "
                       f"{model.device.type}, where notebook 00's launch comparison measures the gap instead.")
    nbytes, timing = read_timing(model.device, repeats=7)
    bandwidth = read_bandwidth(nbytes, timing.median)
    profile = profile_decode_step(model, batch=1, context=context, steps=steps)
    weights, cache = model.weight_bytes(), kv_cache_bytes(model.config, context + 1, 1, model.dtype)
    wake, calls = fork_join_seconds(), profile["calls"]["matmuls"]
    kernels = profile["seconds"]
    matmuls = kernels["matmuls"]
    others = sum(kernels[k] for k in ("attention", "norms and elementwise", "sampling"))
    step = profile["step_seconds"]
    parts = {"reading the bytes": (weights + cache) / bandwidth,
             "matmul kernels past their bytes": max(matmuls - weights / bandwidth - wake * calls, 0.0),
             "thread wake-ups": wake * calls,
             "other kernels past the cache's bytes": max(others - cache / bandwidth, 0.0)}
    parts["Python and dispatch"] = max(step - sum(parts.values()), 0.0)
    layers = model.config.num_layers
    return {"step_seconds": step, "parts": parts, "read_bandwidth": bandwidth, "bytes": weights + cache,
            "fraction": parts["reading the bytes"] / step, "layers": layers,
            "matmul_seconds_per_layer": matmuls / layers, "matmul_floor_per_layer": weights / bandwidth / layers,
            "matmul_calls": calls, "fork_join_seconds": wake, "profile": profile}


def gap_sentences(label: str, gap: dict) -> list[str]:
    """The gap in words: the floor's share of the step, each part in ms, and the largest part past
    the floor. Introduced in notebook 00 (where the time goes)."""
    ms = {part: 1e3 * seconds for part, seconds in gap["parts"].items()}
    beyond = max(PARTS[1:], key=lambda part: ms[part])
    return [f"{label}: {1e3 * gap['step_seconds']:.2f} ms per step; reading its {gap['bytes'] / 1e6:.0f} MB at "
            f"{gap['read_bandwidth'] / 1e9:.1f} GB/s would take {ms[PARTS[0]]:.2f} ms, so the step reads at "
            f"{gap['fraction']:.0%} of the read bandwidth.",
            "  " + "; ".join(f"{part} {ms[part]:.2f} ms" for part in PARTS) + ".",
            f"  Per layer the weight matmuls took {1e6 * gap['matmul_seconds_per_layer']:.0f} µs against "
            f"{1e6 * gap['matmul_floor_per_layer']:.0f} µs at the read bandwidth; {gap['matmul_calls']:.0f} matmul "
            f"calls per step, each waking the threads ({1e6 * gap['fork_join_seconds']:.1f} µs a time).",
            f"  The largest part past the floor: {beyond}."]
