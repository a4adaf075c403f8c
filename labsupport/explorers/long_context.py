"""Notebook 08's explorer: context length, batch, kv-heads and KV precision, live.

Introduced in notebook 08 (long context).

For every setting it computes what one decode step reads per generated token, split into
weights and cache (`long_context_bytes.step_bytes`), and the time that takes at the bandwidth
this machine's decode steps reached (`predicted_step_seconds`). Where the setting is one
the embedded model can run (its own kv-heads, a float or an int8 cache) and the cache fits
the memory offered, it also times one decode step on a cache of random values
(`step_timing.filled_cache`); every measured point is kept and drawn beside the curve.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np

from ..lab.long_context_bytes import KV_PRECISIONS, decode_weight_bytes, predicted_step_seconds, step_bytes
from ..engine.hardware import dtype_name
from ..lab.step_timing import filled_cache, step_runner
from ..lab.measure import time_fn
from ..plots.long_context_explorer import explorer_curve_figure, explorer_step_figure
from ..lab.workloads import long_context_workload
from .base import Explorer

BATCHES = (1, 2, 4, 8, 16, 32, 64)
MEASURE_LIMIT_BYTES = 2 * 2**30       # never allocate a cache larger than this to measure a point


class MeasuredSteps:
    """Seconds per decode step keyed by (context, batch, cache kind); measures on a miss.
    Introduced in notebook 08 (long context)."""

    def __init__(self, model, repeats: int, measured: dict | None = None):
        self.model, self.repeats = model, repeats
        self.seconds: dict[tuple[int, int, str], float] = dict(measured or {})

    def get(self, context: int, batch: int, kind: str) -> float:
        key = (context, batch, kind)
        if key not in self.seconds:
            cache = filled_cache(self.model, batch, context, kind)
            step = step_runner(self.model, cache)
            self.seconds[key] = time_fn(step, self.model.device, warmup=1, repeats=self.repeats).median
        return self.seconds[key]


def _opening_context(measured: dict, max_context: int, step: int = 64) -> int:
    """The longest context measured at batch 1 that the slider can show, so that opening the
    explorer measures nothing new; else 2048 (or the slider's end)."""
    on_slider = [c for (c, batch, _), _ in measured.items() if batch == 1 and c % step == 0 and c <= max_context]
    return max(on_slider, default=min(2048, max_context - max_context % step))


def long_context_explorer(model, bandwidth: float, measured: dict | None = None, repeats: int = 1,
                          max_context: int | None = None, use_widget: bool | None = None) -> Explorer:
    """Controls: context length, batch, kv-heads, KV precision; figures: bytes and time per
    generated token split into weights and cache, and time per token against the context.

    Introduced in notebook 08 (long context). bandwidth: bytes/s a decode step reaches on
    this machine (the notebook derives it from its own measured steps); measured: {(context,
    batch, "float" or "int8"): seconds per step} already timed, shown at once; max_context:
    the slider's end (default the device's preset, never past the model's context). The slider
    opens on the longest context measured at batch 1.
    """
    config = model.config
    if max_context is None:
        max_context = long_context_workload(model.device).explorer_max_context
    max_context = min(max_context, config.max_position - 1)
    model_precision = {4: "fp32", 2: "fp16/bf16"}[model.dtype.itemsize]
    steps = MeasuredSteps(model, repeats, measured)
    kv_heads = [h for h in range(1, config.num_heads + 1) if config.num_heads % h == 0]
    controls = {
        "context": widgets.IntSlider(value=_opening_context(measured or {}, max_context), min=64, max=max_context, step=64,
                                     description="context", continuous_update=False),
        "batch": widgets.Dropdown(options=BATCHES, value=1, description="batch"),
        "kv_heads": widgets.Dropdown(options=kv_heads, value=config.num_kv_heads, description="kv-heads"),
        "precision": widgets.Dropdown(options=list(KV_PRECISIONS), value=model_precision, description="KV precision"),
    }

    def render(values: dict):
        context, batch, heads, precision = values["context"], values["batch"], values["kv_heads"], values["precision"]
        variant = config.with_(num_kv_heads=heads)
        weights = decode_weight_bytes(variant, model.dtype.itemsize)
        split = step_bytes(variant, weights, context, batch, precision)
        seconds = predicted_step_seconds(split, bandwidth)
        kind = {model_precision: "float", "int8": "int8"}.get(precision)
        measurable = heads == config.num_kv_heads and kind is not None and split["cache"] <= MEASURE_LIMIT_BYTES
        measured_s = steps.get(context, batch, kind) / batch if measurable else None
        detail = f"{config.name}, {heads} kv-heads, {precision} cache, batch {batch}, context {context}"
        note = "" if measurable else "computed only: not this model's shape or precision, or too large to allocate"

        def per_token_seconds(n: int) -> float:
            predicted = predicted_step_seconds(step_bytes(variant, weights, n, batch, precision), bandwidth)
            return predicted["weights_per_token_s"] + predicted["cache_per_token_s"]

        contexts = [int(n) for n in np.linspace(0, max_context, 65)]
        curve = [per_token_seconds(n) for n in contexts]
        points = sorted((c, s / b) for (c, b, k), s in steps.seconds.items() if b == batch and k == kind
                        and heads == config.num_kv_heads)
        return [explorer_step_figure(split, seconds, detail, measured_s, note),
                explorer_curve_figure(contexts, curve, points, highlight=context,
                                      detail=f"{heads} kv-heads, {precision} cache, batch {batch}, "
                                             f"weights in {dtype_name(model.dtype)}")]

    return Explorer(controls, render, title="Long context: what a decode step reads, per generated token",
                    use_widget=use_widget)
