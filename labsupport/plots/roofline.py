"""Figures of notebook 00 (where the time goes): the roofline of this machine
with measured points on it, and time per decode step against batch size.

Introduced in notebook 00 (where the time goes). Pure functions: data in,
plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..measure import HardwareProfile

WIDTH, HEIGHT = 900, 480
DTYPE_COLORS = {"float32": "#1f77b4", "bfloat16": "#d62728", "float16": "#2ca02c"}
POINT_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star")


def _color(dtype: str) -> str:
    return DTYPE_COLORS.get(dtype, "#7f7f7f")


def _intensity_range(profile: HardwareProfile, points: Sequence[dict]) -> tuple[float, float]:
    """x range of the plot: a decade around the ridges and every measured point."""
    xs = [profile.ridge(name) for name in profile.flops] + [p["intensity"] for p in points]
    return min(0.1, min(xs) / 4), max(10.0, max(xs) * 4)


def roofline_figure(profile: HardwareProfile, points: Sequence[dict] = ()) -> go.Figure:
    """Attainable FLOP/s against arithmetic intensity (log-log), one roof per dtype.

    Introduced in notebook 00 (where the time goes).
    profile: the measured `HardwareProfile` (bandwidth and FLOP/s per dtype).
    points: measured work, each a dict with "intensity" (FLOP/byte) and
    "flops_per_s", plus optional "group" (legend entry; points of one group form
    one trace), "dtype" (its color), "label" (hover text) and "size".
    """
    fig = go.Figure()
    low, high = _intensity_range(profile, points)
    for name, peak in profile.flops.items():
        ridge = profile.ridge(name)
        x = [low, ridge, high]
        fig.add_trace(go.Scatter(
            x=x, y=[profile.attainable(v, name) for v in x], mode="lines",
            name=f"roof, {name}: {profile.bandwidth / 1e9:.0f} GB/s, {peak / 1e9:.0f} GFLOP/s",
            line=dict(color=_color(name), width=2),
            hovertemplate="%{x:.3g} FLOP/byte: at most %{y:.3s}FLOP/s<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=[ridge], y=[peak], mode="markers+text", name=f"ridge, {name}", showlegend=False,
            marker=dict(color=_color(name), size=11, symbol="x"),
            text=[f"ridge {ridge:.1f} FLOP/B ({name})"], textposition="top left",
            hovertemplate=f"ridge point ({name}): {ridge:.2f} FLOP/byte<extra></extra>"))

    groups: dict[str, list[dict]] = {}
    for point in points:
        groups.setdefault(point.get("group", "measured"), []).append(point)
    for index, (group, members) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in members], y=[p["flops_per_s"] for p in members],
            mode="markers", name=group,
            marker=dict(color=[_color(p.get("dtype", "")) for p in members],
                        size=[p.get("size", 10) for p in members],
                        symbol=POINT_SYMBOLS[index % len(POINT_SYMBOLS)],
                        line=dict(color="black", width=1)),
            text=[p.get("label", group) for p in members],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>"))

    top = max(profile.flops.values())
    fig.update_xaxes(type="log", title="arithmetic intensity [FLOP/byte]", range=np.log10([low, high]))
    # SI prefixes on the ticks (100G, 1T): plotly's default "100B" reads as bytes.
    fig.update_yaxes(type="log", title="compute speed [FLOP/s]",
                     exponentformat="SI", range=np.log10([profile.bandwidth * low, top * 3]))
    fig.update_layout(title=f"Roofline of {profile.name}", width=WIDTH, height=HEIGHT,
                      template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
    return fig


def step_time_figure(sweep_rows: Sequence[dict], highlight: dict | None = None) -> go.Figure:
    """Time per decode step [ms] and tokens/s against batch size, side by side, one line per dtype.

    Introduced in notebook 00 (where the time goes).
    sweep_rows: dicts with "batch", "seconds", "tokens_per_s" and "dtype"
    (as returned by `roofline.sweep_decode`). highlight: one such row to mark.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("time per decode step", "throughput"))
    by_dtype: dict[str, list[dict]] = {}
    for row in sweep_rows:
        by_dtype.setdefault(row.get("dtype", "measured"), []).append(row)
    for name, rows in by_dtype.items():
        rows = sorted(rows, key=lambda r: r["batch"])
        batches = [r["batch"] for r in rows]
        style = dict(mode="lines+markers", line=dict(color=_color(name)), legendgroup=name)
        fig.add_trace(go.Scatter(x=batches, y=[1e3 * r["seconds"] for r in rows], name=name,
                                 hovertemplate="batch %{x}: %{y:.2f} ms per step<extra></extra>",
                                 **style), row=1, col=1)
        fig.add_trace(go.Scatter(x=batches, y=[r["tokens_per_s"] for r in rows], name=name,
                                 showlegend=False,
                                 hovertemplate="batch %{x}: %{y:.1f} tokens/s<extra></extra>",
                                 **style), row=1, col=2)
    if highlight is not None:
        marker = dict(size=16, color="rgba(0,0,0,0)", line=dict(color="black", width=2))
        fig.add_trace(go.Scatter(x=[highlight["batch"]], y=[1e3 * highlight["seconds"]],
                                 mode="markers", marker=marker, name="current setting",
                                 legendgroup="current"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[highlight["batch"]], y=[highlight["tokens_per_s"]],
                                 mode="markers", marker=marker, name="current setting",
                                 showlegend=False, legendgroup="current"), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title="batch size [sequences]", row=1, col=col)
    fig.update_yaxes(title="time per step [ms]", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="tokens/s [all rows together]", rangemode="tozero", row=1, col=2)
    fig.update_layout(width=WIDTH, height=420, template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="bottom", y=1.08, x=0))
    return fig
