"""Figures of notebook 03 (mixed precision): the bits of each format, memory per dtype,
speed ratios to fp32 in the two regimes, agreement of the logits with fp32, and fp16's overflow.

Introduced in notebook 03 (mixed precision). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..lab.busy import BUSY_VERDICT
from .roofline import DTYPE_COLORS

WIDTH, HEIGHT = 900, 440
FP16_MAX = 65504.0
MODEL_COLORS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b")


def _color(dtype: str) -> str:
    return DTYPE_COLORS.get(dtype, "#7f7f7f")


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title=title, width=WIDTH, height=height, template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    return fig


BIT_COLORS = {"sign": "#7f7f7f", "exponent": "#1f77b4", "mantissa": "#ff7f0e"}


def format_bits_figure(formats: Sequence[dict]) -> go.Figure:
    """The bits of each float format as one bar: sign, exponent (the range), mantissa (the precision).

    Introduced in notebook 03 (mixed precision). formats: dicts with "dtype", "exponent_bits"
    and "mantissa_bits", as from `precision.format_bits`; each bar is drawn to scale, one
    unit per bit, so fp16 and bf16 show the same 16 bits spent differently.
    """
    fig = go.Figure()
    names = [f["dtype"] for f in formats][::-1]                      # the first format on top
    widths = {"sign": [1] * len(formats), "exponent": [f["exponent_bits"] for f in formats],
              "mantissa": [f["mantissa_bits"] for f in formats]}
    for part, color in BIT_COLORS.items():
        bits = widths[part][::-1]
        fig.add_trace(go.Bar(y=names, x=bits, orientation="h", name=part, marker=dict(color=color,
                             line=dict(color="white", width=2)),
                             text=[f"{part} {b}" if part != "sign" else "±" for b in bits],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"%{{y}}: %{{x}} {part} bit(s)<extra></extra>"))
    top = max((1 + f["exponent_bits"] + f["mantissa_bits"] for f in formats), default=32)
    fig.update_xaxes(title="bits (most significant first)", range=[0, top], dtick=4)
    fig.update_layout(barmode="stack", margin=dict(l=90))
    return _layout(fig, "Three float formats: where the bits go", height=120 + 60 * len(formats))


def memory_figure(rows: Sequence[dict], highlight: str | None = None) -> go.Figure:
    """Weights in MiB per dtype, one group of bars per model (or source).

    Introduced in notebook 03 (mixed precision).
    rows: dicts with "model" (legend entry, e.g. "GPT-2, the handbook chapter"),
    "dtype" ("float32", ...) and "mib". highlight: a dtype whose bars get a black outline.
    """
    fig = go.Figure()
    models = list(dict.fromkeys(r["model"] for r in rows))
    for index, model in enumerate(models):
        members = [r for r in rows if r["model"] == model]
        fig.add_trace(go.Bar(
            x=[r["dtype"] for r in members], y=[r["mib"] for r in members], name=model,
            marker=dict(color=MODEL_COLORS[index % len(MODEL_COLORS)],
                        line=dict(color="black", width=[3 if r["dtype"] == highlight else 0 for r in members])),
            text=[f"{r['mib']:.1f}" for r in members], textposition="outside",
            hovertemplate=f"{model}<br>%{{x}}: %{{y:.1f}} MiB<extra></extra>"))
    fig.update_xaxes(title="precision of the weights")
    top = max((r["mib"] for r in rows), default=1.0)
    fig.update_yaxes(title="weights [MiB = 2^20 bytes]", range=[0, top * 1.18])
    fig.update_layout(barmode="group")
    return _layout(fig, "Model weights per precision")


def speed_figure(rows: Sequence[dict], highlight: tuple[str, str] | None = None,
                 claim: float | None = 1.5, busy: str | None = None) -> go.Figure:
    """Speed as a ratio to fp32, grouped by regime, one bar per dtype.

    Introduced in notebook 03 (mixed precision).
    rows: dicts with "regime" (label on the x axis), "dtype" and "speedup" (fp32 time /
    this dtype's time; None when the timing was skipped), optional "note" (why skipped).
    highlight: (regime, dtype) to outline. claim: a dashed line at the handbook chapter's
    fp16 speed-up (~1.5x); None for no line. busy: why the machine looked busy while
    these were timed (`busy.busy_reason`), written above the bars; None when it was quiet.
    """
    fig = go.Figure()
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    for dtype in dtypes:
        members = {r["regime"]: r for r in rows if r["dtype"] == dtype}
        xs = [g for g in regimes if g in members]
        values = [members[g]["speedup"] for g in xs]
        fig.add_trace(go.Bar(
            x=xs, y=[v if v is not None else 0 for v in values], name=dtype,
            marker=dict(color=_color(dtype),
                        line=dict(color="black",
                                  width=[3 if highlight == (g, dtype) else 0 for g in xs])),
            text=[f"{v:.2f}x" if v is not None else "skipped" for v in values], textposition="outside",
            hovertext=[members[g].get("note") or f"{dtype}: {members[g]['speedup']:.2f}x fp32's speed"
                       for g in xs],
            hoverinfo="text"))
    # The lines' labels sit right of the plot: inside it they ran into the bars and their values.
    fig.add_hline(y=1.0, line=dict(color="black", width=1), annotation_text="fp32 = 1",
                  annotation_position="right", annotation_font_size=11)
    if claim is not None:
        fig.add_hline(y=claim, line=dict(color="#2ca02c", dash="dash"),
                      annotation_text=f"chapter: fp16 ~{claim:g}x", annotation_position="right",
                      annotation_font=dict(size=11, color="#2ca02c"))
    notes = list(dict.fromkeys(r["note"] for r in rows if r.get("speedup") is None and r.get("note")))
    if busy:
        notes.append(f"{BUSY_VERDICT} ({busy})")
    for index, note in enumerate(notes):
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=1.02 + 0.07 * index,
                           showarrow=False, xanchor="left", font=dict(size=11, color="#555"))
    top = max([r["speedup"] for r in rows if r.get("speedup")] + [claim or 1.0, 1.0])
    fig.update_xaxes(title="regime (batch 1)")
    fig.update_yaxes(title="speed relative to fp32 [x]", range=[0, top * 1.25])
    fig.update_layout(barmode="group", margin=dict(t=90 + 20 * len(notes), r=150))
    return _layout(fig, "Speed of 16-bit weights, relative to fp32 (measured side by side)")


def _log_bins(values: np.ndarray, floor: float) -> np.ndarray:
    top = max(float(values.max()), floor * 10) if values.size else floor * 10
    return np.logspace(np.log10(floor), np.log10(top) + 0.05, 50)


def agreement_figure(results: dict[str, dict], highlight: str | None = None,
                     floor: float = 1e-5) -> go.Figure:
    """Left: histogram of |logit difference| to fp32 (log x); right: top-1 agreement per dtype.

    Introduced in notebook 03 (mixed precision).
    results: {dtype: {"abs_diff": array of |differences|, "top1_agreement": fraction,
    "max_abs_diff": float}} (as from `explorers.precision.PrecisionLab.agreement`). Differences below `floor`
    (exact matches included) are counted in the first bin.
    highlight: the dtype drawn opaque, the others faint.
    """
    fig = make_subplots(rows=1, cols=2, column_widths=[0.68, 0.32], horizontal_spacing=0.12,
                        subplot_titles=("|logit - fp32 logit| over every vocabulary entry",
                                        "top-1 token same as fp32"))
    diffs = {name: np.clip(np.asarray(r["abs_diff"], dtype=np.float64), floor, None)
             for name, r in results.items()}
    edges = _log_bins(np.concatenate(list(diffs.values())) if diffs else np.array([]), floor)
    centers = np.sqrt(edges[:-1] * edges[1:])
    for name, values in diffs.items():
        counts, _ = np.histogram(values, bins=edges)
        share = counts / max(values.size, 1)
        faint = highlight is not None and name != highlight
        fig.add_trace(go.Scatter(
            x=centers, y=share, mode="lines", line=dict(color=_color(name), width=3, shape="hvh"),
            opacity=0.35 if faint else 1.0, name=f"{name} (max {results[name]['max_abs_diff']:.3g})",
            hovertemplate=f"{name}: %{{y:.1%}} of the logits differ by about %{{x:.2g}}<extra></extra>"),
            row=1, col=1)
    names = list(results)
    fig.add_trace(go.Bar(
        x=names, y=[results[n]["top1_agreement"] for n in names], showlegend=False,
        marker=dict(color=[_color(n) for n in names],
                    line=dict(color="black", width=[3 if n == highlight else 0 for n in names])),
        text=[f"{results[n]['top1_agreement']:.1%}" for n in names], textposition="outside",
        hovertemplate="%{x}: top-1 agrees at %{y:.1%} of the positions<extra></extra>"), row=1, col=2)
    fig.update_xaxes(type="log", title="absolute difference [logit units]", row=1, col=1)
    fig.update_yaxes(title="share of logits", tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title="precision", row=1, col=2)
    fig.update_yaxes(title="positions agreeing", tickformat=".0%", range=[0, 1.15], row=1, col=2)
    return _layout(fig, "How far 16-bit logits are from fp32's")


def overflow_figure(curve: dict) -> go.Figure:
    """x*x in fp32, fp16 and bf16 (left) and its rounding error (right), with fp16's 65504 limit.

    Introduced in notebook 03 (mixed precision).
    curve: {"x": [...], "exact": [...], "float32": [...], "float16": [...], "bfloat16": [...]}
    as from `precision.squares_by_dtype`. Where fp16 gives inf the line stops, and
    crosses mark the overflow.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("x * x computed in each precision", "relative rounding error"))
    x = np.asarray(curve["x"], dtype=np.float64)
    exact = np.asarray(curve["exact"], dtype=np.float64)
    for name in ("float32", "bfloat16", "float16"):
        y = np.asarray(curve[name], dtype=np.float64)
        finite = np.isfinite(y)
        style = dict(color=_color(name), width=2, dash="dot" if name == "float32" else "solid")
        fig.add_trace(go.Scatter(x=x, y=np.where(finite, y, np.nan), mode="lines", name=name, line=style,
                                 legendgroup=name,
                                 hovertemplate=f"{name}: %{{x:.1f}}² = %{{y:.6g}}<extra></extra>"), row=1, col=1)
        if (~finite).any():
            fig.add_trace(go.Scatter(x=x[~finite], y=np.full((~finite).sum(), FP16_MAX * 1.08),
                                     mode="markers", marker=dict(symbol="x", size=5, color=_color(name)),
                                     name=f"{name}: inf (overflow)", legendgroup=name,
                                     hovertemplate=f"{name}: %{{x:.1f}}² = inf<extra></extra>"),
                          row=1, col=1)
        if name != "float32":
            error = np.abs(y - exact) / np.maximum(exact, 1e-30)
            fig.add_trace(go.Scatter(x=x, y=np.where(finite & (error > 0), error, np.nan), mode="markers",
                                     marker=dict(size=4, color=_color(name)), name=name, showlegend=False,
                                     legendgroup=name,
                                     hovertemplate=f"{name}: error %{{y:.2e}} at x=%{{x:.1f}}<extra></extra>"),
                          row=1, col=2)
    fig.add_hline(y=FP16_MAX, line=dict(color="#2ca02c", dash="dash"), row=1, col=1,
                  annotation_text="fp16 max 65504", annotation_position="top left")
    fig.update_xaxes(title="x (an activation)", row=1, col=1)
    fig.update_yaxes(title="x * x", row=1, col=1)
    fig.update_xaxes(title="x (an activation)", row=1, col=2)
    fig.update_yaxes(title="|result - exact| / exact", type="log", row=1, col=2)
    return _layout(fig, "Range against precision: fp16 overflows, bf16 rounds coarsely")
