"""Where one decode step's time goes, split by kind of work with torch.profiler.

Introduced in notebook 00 (where the time goes), as the literal answer to its title.

The roofline (notebook 00) says how fast a step *could* be; the profiler says what it
spent its time on. PyTorch's profiler records every operator the step calls (aten::mm,
aten::scaled_dot_product_attention, aten::mul, ...) with its *self* time, the time spent
in the operator itself and not in the operators it called, so the self times add up
without counting anything twice. Each operator is sorted into one kind of work:

* matmuls: the weight multiplications (linear layers, the int8/int4 kernels);
* attention: scaled-dot-product attention over the cache;
* norms and elementwise: normalization, activations, RoPE, residual adds, copies
  into the cache, the embedding lookup: every other operator that computes;
* sampling: picking the next token from the logits;

and the rest of the wall time, which no computing operator accounts for, is the framework's
and Python's own work: deciding which kernel to call, making views of tensors (metadata
only), the Python code of every module. On a GPU the split uses the kernels' own times, so
the rest is the time the GPU sat idle waiting for the next launch. The profiler adds some overhead of its own to every operator, so
the split is a picture of proportions, and the step's time is measured without it.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

from ..errors import LabError
from ..engine.compiled import SHARED
from ..engine.hardware import synchronize
from .measure import time_fn
from .step_timing import filled_cache, greedy_step, step_runner

KINDS = ("matmuls", "attention", "norms and elementwise", "sampling", "framework and Python")

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
              "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm", "aten::_weight_int4pack_mm_for_cpu",
              "aten::baddbmm", "labsupport::w4a8_linear")           # the last: our W4A8 int4 kernel
VIEW_OPS = ("aten::as_strided", "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose",
            "aten::t", "aten::slice", "aten::select", "aten::expand", "aten::unsqueeze", "aten::squeeze",
            "aten::permute", "aten::_unsafe_view", "aten::detach", "aten::alias", "aten::empty",
            "aten::empty_like", "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg",
            "aten::lift_fresh", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::narrow",
            "aten::unbind", "aten::flatten")
# operators that only call another matmul operator (aten::linear -> aten::mm): not counted as calls
MATMUL_WRAPPERS = ("aten::linear", "aten::matmul")
SAMPLING_OPS = ("aten::argmax", "aten::topk", "aten::multinomial", "aten::sort", "aten::cumsum",
                "aten::softmax", "aten::_softmax")


def kind_of(op_name: str) -> str:
    """The kind of work of one profiler event's name (an operator like "aten::addmm").

    Introduced in notebook 00 (where the time goes). Softmax counts as sampling because
    attention's own softmax happens inside the fused attention operator, not as a
    separate one; the sampling step is where a separate softmax appears.
    """
    if op_name in MATMUL_OPS or "int4pack" in op_name or "int8pack" in op_name or "mkldnn_linear" in op_name:
        return "matmuls"
    if ("scaled_dot_product" in op_name or "flash_attention" in op_name or "efficient_attention" in op_name
            or op_name == "labsupport::attend_one_row"):         # the attention inside fused.decode_block
        return "attention"
    if op_name in SAMPLING_OPS:
        return "sampling"
    if op_name in VIEW_OPS:              # a new view of the same data: metadata only, no arithmetic
        return "framework and Python"
    return "norms and elementwise"


def compiled_greedy_step(model, cache, next_tokens):
    """The same step through torch.compile (`compiled.SHARED`, the decoder
    `generate(compile=True)` runs), and the greedy pick. Introduced in notebook 00 (where
    the time goes). The first call compiles (and on a GPU records the CUDA graph): the warm-up,
    untimed. Inductor fuses the norms and elementwise operators into a few generated kernels,
    which the profiler records inside the compiled region, not as separate operators: they
    count as "norms and elementwise"; its matmuls still appear as matmul operators."""
    path = SHARED.warm_up(model, cache)
    if not path.compiled:
        raise LabError(path.note.replace("decoding without it", "so its step cannot be profiled"))
    rows = cache.batch_size
    positions = torch.full((rows, 1), cache.length, dtype=torch.long, device=cache.device)    # (rows, 1)
    key_mask = torch.ones(rows, cache.max_len, dtype=torch.bool, device=cache.device)        # every slot real
    return SHARED.step(model, cache, next_tokens, positions, key_mask).argmax(dim=-1)        # (rows,)


@contextmanager
def _native_stderr_silenced():
    """The profiler's C++ side prints a "profiler_start" and a "profiler_stop" line on the
    process's stderr, which a notebook shows in red; silence file descriptor 2 meanwhile."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@torch.inference_mode()
def profile_decode_step(model, batch: int = 1, context: int = 64, steps: int = 5, step_fn=None) -> dict:
    """Profile `steps` decode steps (with the greedy pick) of `model` at `batch` rows after
    `context` cached tokens, and split one step's time by kind of work.

    Introduced in notebook 00 (where the time goes). Returns a dict with:
    step_seconds (the step's median time, measured without the profiler), seconds (one
    step's seconds per kind, under the profiler, in the order of KINDS), share (the same
    as fractions of the profiled step), and top (the 8 operators with the most self time:
    name, kind, seconds per step, calls per step), calls (operator calls per step, by kind: a matmul
    call is one weight matrix, one parallel region on a CPU), operators_per_step (the operators the step
    called, not counting those nested inside another). step_fn(model, cache, next_tokens), the
    work of one step, defaults to the eager decode step and its argmax; pass
    `compiled_greedy_step` for the compiled step (its first calls compile: a minute or two
    on a 2-core CPU for the embedded model, untimed warm-up).
    """
    if not isinstance(batch, int) or batch < 1 or not isinstance(steps, int) or steps < 1:
        raise LabError(f"profile_decode_step takes whole numbers batch >= 1 and steps >= 1, got {batch} and {steps}.")
    # eager on purpose: the launches are what this profile shows
    one_step = step_runner(model, filled_cache(model, batch, context), step_fn or greedy_step, graphed=False)
    step_seconds = time_fn(one_step, model.device, warmup=2, repeats=max(steps, 3)).median
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if model.device.type == "cuda" else [])
    with _native_stderr_silenced(), profile(activities=activities) as prof:
        synchronize(model.device)
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        synchronize(model.device)
        wall = (time.perf_counter() - start) / steps
    result = _split(prof.key_averages(), wall, steps, step_seconds, model.device.type == "cuda")
    # operators the step called itself (nested calls inside an operator not counted)
    result["operators_per_step"] = sum(1 for event in prof.events()
                                       if event.cpu_parent is None and "::" in event.name) / steps
    return result


def _split(events, wall: float, steps: int, step_seconds: float, on_gpu: bool) -> dict:
    """Seconds per step and kind from the profiler's per-operator averages (self times in µs)."""
    seconds, calls = dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0.0)
    ops = []
    for event in events:
        self_us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
        per_step = self_us * 1e-6 / steps
        kind = kind_of(event.key)
        seconds[kind] += per_step
        calls[kind] += 0 if event.key in MATMUL_WRAPPERS else event.count / steps
        ops.append({"name": event.key, "kind": kind, "seconds": per_step, "calls": event.count / steps})
    # the framework's share: everything the computing operators do not account for (view
    # operators' metadata work included; on a GPU, the time its kernels left it idle)
    computing = sum(value for kind, value in seconds.items() if kind != "framework and Python")
    seconds["framework and Python"] = max(wall - computing, 0.0)
    total = sum(seconds.values()) or 1.0
    top = sorted(ops, key=lambda op: op["seconds"], reverse=True)[:8]
    return {"step_seconds": step_seconds, "profiled_step_seconds": wall, "seconds": seconds,
            "share": {kind: value / total for kind, value in seconds.items()}, "top": top,
            "calls": calls}
