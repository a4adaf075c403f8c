"""Figures of notebook 00 (where the time goes): the roofline of this machine
with measured points on it (`sweep_points` labels each with its batch size), time
per decode step against batch size, and a diagram of why a batch raises the
intensity (`matvec_matmul_figure`).

Introduced in notebook 00 (where the time goes). Pure functions: data in,
plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import LabError
from ..lab.roofs import HardwareProfile

WIDTH, HEIGHT = 900, 480
DTYPE_COLORS = {"float32": "#1f77b4", "bfloat16": "#d62728", "float16": "#2ca02c"}
POINT_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star")
# Where a point's batch label goes, turned by its dtype and group, so that labels of points at the
# same intensity (float32 at batch 2, bfloat16 at batch 1) do not print over each other.
LABEL_POSITIONS = ("bottom right", "top left", "top right", "bottom left")


def _color(dtype: str) -> str:
    return DTYPE_COLORS.get(dtype, "#7f7f7f")


def _label_position(point: dict, group_index: int) -> str:
    """Where the batch label of `point`, in the `group_index`-th group, goes (`LABEL_POSITIONS`)."""
    dtypes = list(DTYPE_COLORS)
    dtype_index = dtypes.index(point["dtype"]) if point.get("dtype") in dtypes else 0
    return LABEL_POSITIONS[(dtype_index + group_index) % len(LABEL_POSITIONS)]


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
    one trace), "dtype" (its color), "label" (hover text), "size" and "batch"
    (written beside the marker, so each point shows its batch size).
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
            mode="markers+text", name=group,
            marker=dict(color=[_color(p.get("dtype", "")) for p in members],
                        size=[p.get("size", 10) for p in members],
                        symbol=POINT_SYMBOLS[index % len(POINT_SYMBOLS)],
                        line=dict(color="black", width=1)),
            text=[f"B={p['batch']}" if "batch" in p else "" for p in members],
            textposition=[_label_position(p, index) for p in members], textfont=dict(size=10),
            customdata=[p.get("label", group) for p in members],
            hovertemplate="%{customdata}<br>%{x:.3g} FLOP/byte, %{y:.3s}FLOP/s<extra></extra>"))

    top = max(profile.flops.values())
    fig.update_xaxes(type="log", title="arithmetic intensity [FLOP/byte]", range=np.log10([low, high]))
    # SI prefixes on the ticks (100G, 1T): plotly's default "100B" reads as bytes.
    fig.update_yaxes(type="log", title="compute speed [FLOP/s]",
                     exponentformat="SI", range=np.log10([profile.bandwidth * low, top * 3]))
    fig.update_layout(title=f"Roofline of {profile.name}", width=WIDTH, height=HEIGHT,
                      template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
    return fig


def sweep_points(rows: Sequence[dict], group: str, size: int = 10) -> list[dict]:
    """Points for `roofline_figure` from the rows of `roofline.sweep_decode` or `sweep_linear`:
    each carries its batch size (written beside it) and a hover label with dtype, batch and time.

    Introduced in notebook 00 (where the time goes).
    """
    return [{"intensity": r["intensity"], "flops_per_s": r["flops_per_s"], "dtype": r["dtype"],
             "batch": r["batch"], "group": group, "size": size,
             "label": f"{r['dtype']}, batch {r['batch']}: {1e3 * r['seconds']:.2f} ms"} for r in rows]


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


# --------------------------------------------------------------------------
# Matrix-vector against matrix-matrix: why a batch raises the intensity
# --------------------------------------------------------------------------

WEIGHT_COLOR, INPUT_COLOR, OUTPUT_COLOR, HIGHLIGHT = "#c6dbef", "#c7e9c0", "#eeeeee", "#d62728"
GAP = 1.0   # space between the blocks, in cells


def _cells(x0: float, y0: float, rows: int, cols: int, fill, axis: str) -> list[dict]:
    """Rectangles for a rows x cols block whose top-left corner is at (x0, y0); fill(row, col) -> color."""
    return [dict(type="rect", xref=axis, yref=axis.replace("x", "y"), x0=x0 + c, x1=x0 + c + 1,
                 y0=y0 - r - 1, y1=y0 - r, fillcolor=fill(r, c), line=dict(color="white", width=1.5))
            for r in range(rows) for c in range(cols)]


def _product_panel(batch: int, in_features: int, out_features: int, axis: str) -> list[dict]:
    """The blocks of y = x W^T for `batch` rows: x on the left, W^T on top, y where they meet.

    One weight, W^T[1, 2], is marked; so are the inputs it multiplies (column 1 of x) and
    the outputs it adds to (column 2 of y): one of each per row of the batch.
    """
    k, n = 1, min(2, out_features - 1)                   # the marked weight: input k, output n
    top = batch + GAP + in_features                      # W^T sits above y, x to the left of y
    weights = _cells(0, top, in_features, out_features,
                     lambda r, c: HIGHLIGHT if (r, c) == (k, n) else WEIGHT_COLOR, axis)
    inputs = _cells(-GAP - in_features, batch, batch, in_features,
                    lambda r, c: "#f4a582" if c == k else INPUT_COLOR, axis)
    outputs = _cells(0, batch, batch, out_features, lambda r, c: "#f4a582" if c == n else OUTPUT_COLOR, axis)
    return weights + inputs + outputs


def matvec_matmul_figure(batch: int = 4, in_features: int = 6, out_features: int = 5,
                         bytes_per_value: int = 4) -> go.Figure:
    """A diagram of one linear layer y = x W^T at batch 1 (matrix-vector) and at `batch` (matrix-matrix).

    Introduced in notebook 00 (where the time goes). At batch 1 each weight is read from
    memory for a single multiply-add (2 FLOPs): 2 / bytes_per_value FLOP per byte. With
    `batch` rows the same weight, read once, meets `batch` inputs and adds to `batch`
    outputs: 2 x batch FLOPs for the same bytes. One weight and the values it touches are
    marked in color; hovering a weight says how often it is used.
    """
    if batch < 2 or in_features < 2 or out_features < 2:
        raise LabError("matvec_matmul_figure needs batch, in_features and out_features of 2 or more.")
    titles = ("batch 1: matrix x vector", f"batch {batch}: matrix x matrix")
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.06)
    shapes = []
    for col, (rows, axis) in enumerate(((1, "x"), (batch, "x2")), start=1):
        shapes += _product_panel(rows, in_features, out_features, axis)
        top = rows + GAP + in_features
        used = "used 1 time" if rows == 1 else f"used {rows} times"
        centers = [(c + 0.5, top - r - 0.5) for r in range(in_features) for c in range(out_features)]
        fig.add_trace(go.Scatter(
            x=[x for x, _ in centers], y=[y for _, y in centers], mode="markers", showlegend=False,
            marker=dict(size=14, opacity=0), hovertext=[f"W[{c}, {r}]: read once, {used}"
                                                        for r in range(in_features) for c in range(out_features)],
            hoverinfo="text"), row=1, col=col)
        flops = 2 * rows
        notes = [(out_features / 2, top + 0.6, f"W<sup>T</sup> ({in_features} x {out_features} weights)"),
                 (-GAP - in_features / 2, rows + 0.6, f"x ({rows} x {in_features})"),
                 (out_features / 2, -0.6, f"y = x W<sup>T</sup> ({rows} x {out_features})"),
                 (-GAP / 2, -2.2, f"each weight: read once ({bytes_per_value} bytes), {used}<br>"
                                  f"{flops} FLOP / {bytes_per_value} bytes = <b>{flops / bytes_per_value:.2g} FLOP/byte</b>")]
        for x, y, text in notes:
            fig.add_annotation(x=x, y=y, text=text, showarrow=False, font=dict(size=12), row=1, col=col)
    height = batch + GAP + in_features
    for col in (1, 2):
        fig.update_xaxes(visible=False, range=[-GAP - in_features - 0.5, out_features + 0.5],
                         scaleanchor=f"y{'' if col == 1 else col}", row=1, col=col)
        fig.update_yaxes(visible=False, range=[-3.2, height + 1.2], row=1, col=col)
    fig.update_layout(shapes=shapes, width=WIDTH, height=480, template="plotly_white", font=dict(size=12),
                      margin=dict(t=100, b=20),
                      title=dict(text="Why a batch raises the arithmetic intensity of a linear layer<br><sup>red: "
                                      "one weight; orange: the inputs it multiplies and the outputs it adds to"
                                      "</sup>"))
    return fig


KIND_COLORS = {"matmuls": "#1f77b4", "attention": "#ff7f0e", "norms and elementwise": "#2ca02c",
               "sampling": "#9467bd", "framework and Python": "#7f7f7f"}


def step_profile_figure(profiles: dict[str, dict]) -> go.Figure:
    """One horizontal bar per profiled decode step (`roofline_step_profile.profile_decode_step`), split
    into its kinds of work, as shares of the step; the hover gives milliseconds per step.

    Introduced in notebook 00 (where the time goes). profiles: {label: result}, e.g.
    {"float32, batch 1": ..., "float32, batch 48": ...}.
    """
    if not profiles:
        raise LabError("step_profile_figure needs at least one profile_decode_step result.")
    labels = list(profiles)
    fig = go.Figure()
    for kind, color in KIND_COLORS.items():
        shares = [profiles[label]["share"][kind] for label in labels]
        ms = [1e3 * profiles[label]["seconds"][kind] for label in labels]
        fig.add_trace(go.Bar(y=labels, x=shares, name=kind, orientation="h", marker_color=color,
                             text=[f"{s:.0%}" if s >= 0.06 else "" for s in shares], textposition="inside",
                             customdata=ms, hovertemplate=f"{kind}: %{{x:.0%}} (%{{customdata:.2f}} ms per step)"
                                                          "<extra>%{y}</extra>"))
    fig.update_layout(barmode="stack", title="Where one decode step's time goes (torch.profiler)",
                      xaxis=dict(title="share of the profiled step", tickformat=".0%", range=[0, 1]),
                      width=WIDTH, height=160 + 60 * len(labels), template="plotly_white",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig

