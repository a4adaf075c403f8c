"""Notebook 00's explorer: batch size and precision on this machine's roofline, live.

Introduced in notebook 00 (where the time goes).

Releasing the batch slider (or choosing a precision) times one decode step at
that setting and redraws two figures: the roofline with the point where the
step sits (it moves right as the batch grows, then stops climbing once it hits
the flat roof), and time per step and tokens/s against batch size. Every
measurement is kept, so going back to a setting already seen is instant.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from ..errors import LabError
from ..lab.roofs import HardwareProfile
from ..plots.roofline import roofline_figure, step_time_figure
from ..lab.roofline import measure_decode_point, supported_dtypes
from ..lab.variants import ModelVariants
from ..lab.workloads import preset
from .base import Explorer


def _unpack(model_or_pair):
    """Accept a model or load_model's (model, tokenizer) pair."""
    return model_or_pair[0] if isinstance(model_or_pair, tuple) else model_or_pair


def model_variants(models) -> ModelVariants:
    """The explorer's models as a `ModelVariants`: from one model (or load_model's (model,
    tokenizer) pair), whose other precisions are cast from it (`precision.cast_model`); from a
    dict {dtype: model or pair}, each kept as given; or from a factory dtype -> model (or pair),
    called once per precision. Introduced in notebook 00 (where the time goes)."""
    if isinstance(models, ModelVariants):
        return models
    if isinstance(models, dict):
        return ModelVariants(models={dtype: _unpack(m) for dtype, m in models.items()})
    if callable(models) and not isinstance(models, torch.nn.Module):
        return ModelVariants(factory=lambda dtype: _unpack(models(dtype)))
    return ModelVariants(_unpack(models))


class DecodePoints:
    """Measured decode steps keyed by (dtype name, batch); measures on a miss.
    Notebook 00 (where the time goes)."""

    def __init__(self, models: ModelVariants, context: int, repeats: int, measured=()):
        self.models, self.context, self.repeats = models, context, repeats
        self.rows: dict[tuple[str, int], dict] = {(r["dtype"], r["batch"]): r for r in measured}

    def get(self, dtype_name: str, batch: int) -> dict:
        key = (dtype_name, batch)
        if key not in self.rows:
            model = self.models.get(dtype_name)
            self.rows[key] = measure_decode_point(model, batch, self.context, self.repeats)
        return self.rows[key]

    def all(self) -> list[dict]:
        return list(self.rows.values())


def roofline_points(rows: list[dict], current: dict) -> list[dict]:
    """Points for `roofline_figure`: every measured step, and the current one large, each
    labelled with its batch size. Notebook 00 (where the time goes)."""
    points = [{"intensity": r["intensity"], "flops_per_s": r["flops_per_s"], "dtype": r["dtype"],
               "batch": r["batch"], "group": "measured decode steps", "size": 8,
               "label": f"{r['dtype']}, batch {r['batch']}: {1e3 * r['seconds']:.1f} ms/step"}
              for r in rows if r is not current]
    points.append({"intensity": current["intensity"], "flops_per_s": current["flops_per_s"],
                   "dtype": current["dtype"], "batch": current["batch"], "group": "current setting", "size": 18,
                   "label": f"{current['dtype']}, batch {current['batch']}: "
                            f"{1e3 * current['seconds']:.1f} ms/step, {current['tokens_per_s']:.0f} tokens/s"})
    return points


def roofline_explorer(models, profile: HardwareProfile, batches=None, context: int = 64,
                      repeats: int = 3, measured=(), use_widget: bool | None = None) -> Explorer:
    """Controls: batch size (slider) and precision (dropdown); figures: the roofline with
    the measured point, and time per step and tokens/s against batch size.

    Introduced in notebook 00 (where the time goes).
    models: one model (other dtypes are copies cast by `precision.cast_model`), a dict
    {dtype: model}, a factory dtype -> model (or -> (model, tokenizer)), called once per dtype
    when first chosen, or a `ModelVariants` (see `model_variants`).
    profile: the `HardwareProfile` from `roofs.probe()`; its dtypes the device runs
    natively are the precision choices. batches: slider positions (default: the device's
    ``roofline_batches``, `workloads.PRESETS`). measured: rows already measured (from `sweep_decode`),
    so those settings show at once.
    """
    sources = model_variants(models)
    given = sources.names()
    device = sources.get(given[0]).device if given else profile.device
    batches = list(batches or preset(device).roofline_batches)
    dtype_names = supported_dtypes(profile)
    if not dtype_names:
        raise LabError("The hardware profile has no dtype this device runs; call probe() again.")
    points = DecodePoints(sources, context, repeats, measured)
    start_dtype = next((n for n in dtype_names if n in given), dtype_names[0])

    controls = {
        "batch": widgets.SelectionSlider(options=batches, value=batches[0], description="batch size",
                                         continuous_update=False, style={"description_width": "initial"}),
        "dtype": widgets.Dropdown(options=dtype_names, value=start_dtype, description="precision"),
    }

    def render(values: dict):
        current = points.get(values["dtype"], values["batch"])
        rows = points.all()
        return [roofline_figure(profile, roofline_points(rows, current)),
                step_time_figure(rows, highlight=current)]

    return Explorer(controls, render, title=f"One decode step on the roofline (context {context} tokens)",
                    use_widget=use_widget)
