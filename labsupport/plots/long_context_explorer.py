"""The two figures of notebook 08's explorer: one decode step's bytes and time per generated
token, split into weights and cache, and the time per token against the context.

Introduced in notebook 08 (long context). Laid out for a notebook column about 1366 px wide
screens give: short axis labels and titles, the details (model, kv-heads, precision, batch)
in a subtitle and in each bar's hover, and the legend below the plots, where it cannot cover
a subplot title. Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .long_context import COLORS, MIB

WIDTH, HEIGHT = 900, 440
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.18, xanchor="center", x=0.5)


def _layout(fig: go.Figure, title: str, subtitle: str) -> go.Figure:
    fig.update_layout(title=dict(text=f"{title}<br><sup>{subtitle}</sup>", x=0, xanchor="left", y=0.96),
                      width=WIDTH, height=HEIGHT, template="plotly_white", font=dict(size=13),
                      legend=LEGEND_BELOW, margin=dict(t=100, b=90, l=60, r=20), hovermode="closest")
    return fig


def explorer_step_figure(bytes_per_token: Mapping, seconds_per_token: Mapping, detail: str,
                         measured_s: float | None = None, note: str = "") -> go.Figure:
    """Bytes and milliseconds one decode step costs per generated token, weights and cache stacked
    (computed), with the measured step / batch beside them when there is one (the last bar).
    Introduced in notebook 08 (long context). detail: the setting, in the subtitle and the hover;
    note: why nothing was measured, appended to the subtitle."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("MiB read per token", "ms per token"),
                        horizontal_spacing=0.15)
    for part in ("weights", "cache"):
        mib, ms = bytes_per_token[f"{part}_per_token"] / MIB, 1e3 * seconds_per_token[f"{part}_per_token_s"]
        fig.add_trace(go.Bar(x=["read"], y=[mib], name=part, marker_color=COLORS[part], legendgroup=part,
                             hovertemplate=f"{part}: %{{y:,.1f}} MiB per token<br>{detail}<extra></extra>"), 1, 1)
        fig.add_trace(go.Bar(x=["computed"], y=[ms], name=part, marker_color=COLORS[part], legendgroup=part,
                             showlegend=False,
                             hovertemplate=f"{part}: %{{y:.3f}} ms per token (bytes / bandwidth)<br>{detail}"
                                           "<extra></extra>"), 1, 2)
    if measured_s is not None:
        fig.add_trace(go.Bar(x=["measured"], y=[1e3 * measured_s], name="measured step / batch",
                             marker_color="black",
                             hovertemplate=f"measured: %{{y:.3f}} ms per token<br>{detail}<extra></extra>"), 1, 2)
    fig.update_layout(barmode="stack")
    return _layout(fig, "One decode step, per generated token", detail + (f" · {note}" if note else ""))


def explorer_curve_figure(contexts: Sequence[int], predicted_s: Sequence[float],
                          measured: Sequence[tuple[int, float]] = (), highlight: int | None = None,
                          detail: str = "") -> go.Figure:
    """Milliseconds per generated token against the context: the memory-bound prediction (a line)
    and the steps measured so far (dots), the explorer's context marked. Introduced in notebook 08."""
    fig = go.Figure(go.Scatter(x=list(contexts), y=[1e3 * s for s in predicted_s], mode="lines",
                               name="computed (bytes / bandwidth)", line=dict(color=COLORS["cache"]),
                               hovertemplate="context %{x}: %{y:.3f} ms per token (computed)<extra></extra>"))
    if measured:
        fig.add_trace(go.Scatter(x=[c for c, _ in measured], y=[1e3 * s for _, s in measured], mode="markers",
                                 name="measured (step / batch)", marker=dict(size=9, color="black"),
                                 hovertemplate="context %{x}: %{y:.3f} ms per token (measured)<extra></extra>"))
    if highlight is not None:
        fig.add_vline(x=highlight, line=dict(dash="dot", color="#555"))
    fig.update_xaxes(title="context (tokens)")
    fig.update_yaxes(title="ms per token", rangemode="tozero")
    return _layout(fig, "Time per token against the context", detail)
