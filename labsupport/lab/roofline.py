"""Where the time of one decode step goes: FLOPs, bytes, and the roofline.

Introduced in notebook 00 (where the time goes).

A decode step feeds one new token per sequence through the model. It must read
every weight once (shared by all rows of the batch) and each row's KV cache,
and it does about 2 FLOPs per weight per row (one multiply, one add) plus the
attention over the cached positions. Dividing the two gives the step's
arithmetic intensity, in FLOP per byte:

    intensity(batch) ~ 2 x params x batch / weight bytes     (short contexts)

A machine reads `bandwidth` bytes/s and multiplies at `peak` FLOP/s; work
with fewer than `peak / bandwidth` FLOP per byte (the ridge point) waits for
memory, work with more waits for arithmetic (Williams, Waterman and Patterson,
"Roofline", CACM 2009). So at batch 1 a decode step is memory-bound, and the
batch at which its intensity reaches the ridge is where batching stops being
free. This module counts the costs (`decode_step_cost`, `linear_cost`),
predicts that batch (`ridge_batch`), measures the real thing
(`time_decode_step`, `sweep_decode`, `sweep_linear`) and sets each measured step
against the roofline (`roofline_seconds`, `roof_fraction`, `step_bounds`). The
benchmark section is `bench.roofline`; the chapter's claims against a sweep are
`claims.roofline_claims`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..errors import LabError
from ..engine.hardware import bf16_supported, bytes_per_value, dtype_name, pick_device
from .measure import Timing, time_fn
from .roofs import HardwareProfile
from .step_timing import filled_cache, step_runner
from ..engine.config import ModelConfig
from .timing_model import batches_that_fit, capped
from .workloads import preset

# The batch sizes swept by default are the device's preset (`workloads.PRESETS`): a CPU
# crosses its ridge after a few dozen rows, a GPU (ridge of 100-300 FLOP/byte) only after a few hundred.


# --------------------------------------------------------------------------
# Counting: what one step computes and reads
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one piece of work, and their ratio.

    Introduced in notebook 00 (where the time goes). `bytes` = `weight_bytes`
    + `kv_bytes` (+ activations, for a single linear layer); `intensity` is
    flops / bytes, in FLOP per byte.
    """

    flops: float
    bytes: float
    weight_bytes: float
    kv_bytes: float
    intensity: float

    def to_dict(self) -> dict:
        return asdict(self)


def matmul_params(config: ModelConfig) -> int:
    """Weights that take part in a matrix multiply per token: every layer's
    attention and MLP matrices plus the output projection (lm_head).

    Introduced in notebook 00 (where the time goes). Norms, biases and the
    embedding lookup are left out: they cost a few FLOPs per value, not 2 per row.
    The count lives beside the model: `ModelConfig.matmul_params`.
    """
    return config.matmul_params


def params_read_per_step(config: ModelConfig) -> int:
    """Parameters a decode step reads in full: all of them except lookup tables.

    Introduced in notebook 00 (where the time goes). The token embedding is
    read one row per token, so it counts only when it is tied to the output
    projection (then it is read in full, as lm_head); learned positions
    (GPT-2) are a lookup too. Matches `Transformer.weight_bytes()`; the count lives beside
    the model: `ModelConfig.params_read_per_step`.
    """
    return config.params_read_per_step


def attention_flops(config: ModelConfig, batch: int, context: int) -> int:
    """FLOPs of one new token per row attending to `context` cached positions:
    q.k scores and the weighted sum of values, 2 x head_dim each, per head and layer.
    Notebook 00 (where the time goes). The count lives beside the model: `ModelConfig.attention_flops`."""
    return config.attention_flops(batch, context)


def decode_step_cost(config: ModelConfig, batch: int, context: int, dtype=torch.float32) -> StepCost:
    """FLOPs and bytes of one decode step: `batch` rows, each attending to `context` cached tokens.

    Introduced in notebook 00 (where the time goes).
    FLOPs = 2 x matmul weights x batch (lm_head included) + attention over the cache.
    Bytes = every weight once (shared by the batch) + each row's KV cache.
    `dtype` is the storage dtype of weights and cache (or bytes per value, an int).
    """
    if batch < 1 or context < 0:
        raise LabError(f"Need batch >= 1 and context >= 0, got batch={batch}, context={context}.")
    size = bytes_per_value(dtype)
    flops = config.decode_flops(batch, context)
    weight_bytes = config.params_read_per_step * size
    kv_bytes = config.kv_values_per_token * context * batch * size
    total = weight_bytes + kv_bytes
    return StepCost(flops=flops, bytes=total, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
                    intensity=flops / total)


def linear_cost(out_features: int, in_features: int, batch: int, dtype=torch.float32) -> StepCost:
    """FLOPs and bytes of one linear layer y = x W^T on `batch` rows.

    Introduced in notebook 00 (where the time goes). Reads the weight once and
    each row's input and output, and does 2 FLOPs (a multiply and an add) per
    weight per row. So the intensity is about 2 x batch / bytes-per-value while
    the weight dominates the bytes, and approaches 2 x in x out / (in + out) /
    bytes-per-value at a huge batch, where the activations dominate.
    """
    size = bytes_per_value(dtype)
    flops = 2 * out_features * in_features * batch
    weight_bytes = out_features * in_features * size
    activation_bytes = batch * (in_features + out_features) * size
    total = weight_bytes + activation_bytes
    return StepCost(flops=flops, bytes=total, weight_bytes=weight_bytes, kv_bytes=0,
                    intensity=flops / total)


def attention_intensity(config: ModelConfig, dtype=torch.float32) -> float:
    """FLOP per byte of decode attention over the cache, the same at every batch size and context.

    Introduced in notebook 00 (where the time goes). Per cached token, a row does
    4 x heads x head_dim FLOPs (scores and weighted values) and reads its own keys
    and values, 2 x kv_heads x head_dim values: no other row shares them, so adding
    rows adds bytes as fast as FLOPs. The ratio, 2 x (heads / kv_heads) / bytes-per-value,
    is where a decode step's intensity tends at long context, whatever the batch.
    """
    return 2 * (config.num_heads / config.num_kv_heads) / bytes_per_value(dtype)


def ridge_batch(profile: HardwareProfile, config: ModelConfig, dtype=torch.float32,
                context: int = 0) -> float:
    """The batch size at which a decode step's intensity reaches the machine's ridge point.

    Introduced in notebook 00 (where the time goes). Solves
    intensity(batch) = profile.ridge(dtype) with `decode_step_cost`'s formula:

        batch = ridge x weight_bytes / (flops_per_row - ridge x kv_bytes_per_row)

    At context 0 this is ridge x weight_bytes / (2 x matmul params). Returns
    math.inf when no batch gets there: each row reads its own KV cache, so at a
    long context the step's intensity tends to `attention_intensity`, whatever
    the batch, and where that is below the ridge the step never becomes compute-bound.
    """
    ridge = profile.ridge(dtype)
    one_row = decode_step_cost(config, 1, context, dtype)
    denominator = one_row.flops - ridge * one_row.kv_bytes
    return math.inf if denominator <= 0 else ridge * one_row.weight_bytes / denominator


def ridge_context(profile: HardwareProfile, config: ModelConfig, dtype=torch.float32) -> float:
    """The context length past which no batch size brings a decode step to the ridge (math.inf: none).

    Introduced in notebook 00 (where the time goes). Where one row's FLOPs equal
    ridge x its KV-cache bytes, `ridge_batch`'s denominator reaches 0; past it, every row
    adds more bytes than the ridge allows for its FLOPs. Only when `attention_intensity`
    is below the ridge is there such a context.
    """
    ridge = profile.ridge(dtype)
    empty, one_token = decode_step_cost(config, 1, 0, dtype), decode_step_cost(config, 1, 1, dtype)
    shortfall = ridge * one_token.kv_bytes - (one_token.flops - empty.flops)   # per cached token
    return math.inf if shortfall <= 0 else empty.flops / shortfall


# --------------------------------------------------------------------------
# Measuring: one decode step, one linear layer, and sweeps over the batch
# --------------------------------------------------------------------------


def time_decode_step(model, batch: int, context: int = 64, repeats: int = 3, warmup: int = 1) -> Timing:
    """The `measure.Timing` of one decode step at `batch` rows after `context` cached tokens
    (its `.median` in seconds, its `.spread` for `busy.busy_reason`).

    Introduced in notebook 00 (where the time goes). The cache holds random keys and values
    (`step_timing.filled_cache`: what they are does not change the time), and every timed call
    decodes one token and then rolls the cache back, so all calls do the same work.
    """
    run = step_runner(model, filled_cache(model, batch, context))
    return time_fn(run, model.device, warmup=warmup, repeats=repeats)


def time_linear(out_features: int, in_features: int, batch: int, dtype=torch.float32,
                device=None, repeats: int = 5) -> Timing:
    """The `measure.Timing` of one linear layer (random weight of this shape) on `batch` rows.

    Introduced in notebook 00 (where the time goes).
    """
    device = pick_device(device)
    weight = torch.randn(out_features, in_features, device=device, dtype=dtype) * 0.02
    x = torch.randn(batch, in_features, device=device, dtype=dtype)              # (batch, in)
    with torch.inference_mode():
        return time_fn(lambda: F.linear(x, weight), device, warmup=1, repeats=repeats)


def _row(batch: int, timing: Timing, cost: StepCost, dtype) -> dict:
    """One measured point: time (median, and every repeat), throughput, and where it sits on the roofline."""
    seconds = timing.median
    return {"batch": batch, "dtype": dtype_name(dtype), "seconds": seconds,
            "tokens_per_s": batch / seconds, "flops_per_s": cost.flops / seconds,
            "bytes_per_s": cost.bytes / seconds, "intensity": cost.intensity,
            "flops": cost.flops, "bytes": cost.bytes, "timing": timing.to_dict()}


def measure_decode_point(model, batch: int, context: int = 64, repeats: int = 3) -> dict:
    """Time one decode step at `batch` and place it on the roofline (a dict, see `sweep_decode`).

    Introduced in notebook 00 (where the time goes).
    """
    timing = time_decode_step(model, batch, context, repeats)
    return _row(batch, timing, decode_step_cost(model.config, batch, context, model.dtype), model.dtype)


def sweep_decode(model, batches=None, context: int = 64, repeats: int = 3) -> list[dict]:
    """Time a decode step at each batch size; one dict per batch.

    Introduced in notebook 00 (where the time goes). Each dict holds batch,
    dtype, seconds (per step), tokens_per_s, flops_per_s and bytes_per_s
    achieved, intensity (FLOP/byte), flops and bytes of the step, and timing
    (`measure.Timing.to_dict()`: every repeat, median and spread, which
    `busy.busy_reason` reads before a verdict). `batches` defaults to
    `decode_batches(model.device)`; on a GPU those whose cache would not fit the free memory are
    left out, and the returned `timing_model.Sweep`'s ``note`` says which (`batches_that_fit`).
    """
    batches, note = batches_that_fit(model.config, batches or decode_batches(model.device), context + 1,
                                     model.dtype, model.device, bucketed=False)     # filled_cache: exact size
    return capped([measure_decode_point(model, batch, context, repeats) for batch in batches], note)


def sweep_linear(out_features: int, in_features: int, batches=None, dtype=torch.float32,
                 device=None, repeats: int = 5) -> list[dict]:
    """Time one linear layer of this shape at each batch size; dicts as in `sweep_decode`.

    Introduced in notebook 00 (where the time goes).
    """
    device = pick_device(device)
    batches = batches or linear_batches(device)
    return [_row(batch, time_linear(out_features, in_features, batch, dtype, device, repeats),
                 linear_cost(out_features, in_features, batch, dtype), dtype)
            for batch in batches]


def decode_batches(device) -> list[int]:
    """Batch sizes that reach past the ridge: a few dozen on a CPU, hundreds on a GPU.
    Notebook 00 (where the time goes)."""
    return list(preset(pick_device(device)).roofline_batches)


def linear_batches(device) -> list[int]:
    """Batch sizes for one linear layer: it crosses the ridge at about the same batch.
    Notebook 00 (where the time goes)."""
    return list(preset(pick_device(device)).linear_batches)


def supported_dtypes(profile: HardwareProfile) -> list[str]:
    """The dtypes of `profile` this device computes natively (bfloat16 only with hardware support).
    Notebook 00 (where the time goes)."""
    names = list(profile.flops)
    if "bfloat16" in names and not bf16_supported(profile.device):
        names.remove("bfloat16")
    return names


def growth_batch(rows: list[dict], factor: float = 1.5) -> int | None:
    """The smallest batch whose step takes more than `factor` x the batch-1 step (None if none does).

    Introduced in notebook 00 (where the time goes). Below it, extra rows are
    almost free (memory-bound); above it, time grows with the batch (compute-bound).
    """
    rows = sorted(rows, key=lambda r: r["batch"])
    base = rows[0]["seconds"]
    return next((r["batch"] for r in rows if r["seconds"] > factor * base), None)


# --------------------------------------------------------------------------
# Setting a measured step against the roofline
# --------------------------------------------------------------------------

MEMORY_BOUND, COMPUTE_BOUND, OVERHEAD_BOUND = "memory-bound", "compute-bound", "overhead-bound"
OVERHEAD_SLACK = 2.0   # a step slower than 2x its roofline time is held back by something else


def roofline_seconds(row: dict, profile: HardwareProfile) -> float:
    """The fastest a measured step could run on `profile`: max(bytes / bandwidth, FLOPs / peak).

    Introduced in notebook 00 (where the time goes). `row` is a dict of `sweep_decode`
    or `sweep_linear` (it needs "flops", "bytes" and "dtype"). Reading and computing
    overlap, so the slower of the two sets the time: that is the roofline.
    """
    missing = {"flops", "bytes", "dtype"} - set(row)
    if missing:
        raise LabError(f"A measured row needs {sorted(missing)}; pass the dicts that sweep_decode returns.")
    if row["dtype"] not in profile.flops:
        raise LabError(f"{row['dtype']} was not measured in this profile; call probe(dtypes=[...]) with it included.")
    memory_seconds = row["bytes"] / profile.bandwidth
    compute_seconds = row["flops"] / profile.flops[row["dtype"]]
    return max(memory_seconds, compute_seconds)


def roof_fraction(row: dict, profile: HardwareProfile) -> float:
    """How close a measured step came to the roofline: its roofline time / its measured time.

    Introduced in notebook 00 (where the time goes). 1.0 means the step touched a roof
    (memory or compute); 0.3 means it ran at 30% of the FLOP/s the roofline allows at its
    intensity. Equal to flops_per_s / `profile.attainable(intensity, dtype)`.
    """
    return roofline_seconds(row, profile) / row["seconds"]


def step_bounds(rows: list[dict], profile: HardwareProfile, slack: float = OVERHEAD_SLACK) -> list[str]:
    """What held back each measured step, in the order of `rows`: "memory-bound",
    "compute-bound" or "overhead-bound".

    Introduced in notebook 00 (where the time goes). A step that took more than
    `slack` x its `roofline_seconds` is "overhead-bound": neither roof explains it (per-call
    overhead, a kernel that suits the shape badly). Otherwise it sits on the roof its
    intensity points to: "memory-bound" below the ridge of its dtype, "compute-bound" past it.
    """
    if not slack >= 1:
        raise LabError(f"slack is how many times the roofline time a step may take; use 1 or more, not {slack}.")
    bounds = []
    for row in rows:
        if row["seconds"] > slack * roofline_seconds(row, profile):
            bounds.append(OVERHEAD_BOUND)
        elif row["intensity"] < profile.ridge(row["dtype"]):
            bounds.append(MEMORY_BOUND)
        else:
            bounds.append(COMPUTE_BOUND)
    return bounds

