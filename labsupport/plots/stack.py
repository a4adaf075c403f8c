"""Figures of notebook 07 (putting it together): the cumulative gain of the stacked
techniques, and each stage against the one it builds on.

Introduced in notebook 07 (putting it together). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import log_ticks

KEPT, NOT_KEPT, PEER, BASE = "#2ca02c", "#d62728", "#7f7f7f", "#1f77b4"


def _color(row: dict) -> str:
    if row["stage"] == "Hugging Face generate()":
        return PEER
    if row["builds_on"] is None:
        return BASE
    return KEPT if row["kept"] else NOT_KEPT


def cumulative_figure(result: dict) -> go.Figure:
    """Left: throughput of every stage over the naive loop (log x). Right: each stage's gain
    over the stage it builds on (green: kept; red: does not help here; grey: Hugging Face).
    One row per stage, top to bottom in the ladder's order, named on the row (long names
    stay readable at a laptop's width; rotated ones ran into each other).

    Introduced in notebook 07 (putting it together). result: `stack.run_stack`'s dict.
    """
    rows = result["stages"]
    names = [r["stage"] for r in rows]
    colors = [_color(r) for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, shared_yaxes=True,
                        subplot_titles=("throughput over the naive loop", "gain over the stage it builds on"))
    fig.add_trace(go.Bar(y=names, x=[r["cumulative"] for r in rows], orientation="h", marker_color=colors,
                         text=[f"{r['cumulative']:.1f}x" for r in rows], textposition="outside", cliponaxis=False,
                         hovertext=[f"{r['tokens_per_s']:.1f} tokens/s, {r['precision']}" for r in rows],
                         showlegend=False), row=1, col=1)
    gains = {r["stage"]: r for r in rows if r["gain"] is not None}           # the naive loop has none
    fig.add_trace(go.Bar(y=list(gains), x=[r["gain"] for r in gains.values()], orientation="h",
                         marker_color=[_color(r) for r in gains.values()],
                         text=[f"{r['gain']:.2f}x" for r in gains.values()], textposition="outside",
                         cliponaxis=False, hovertext=[f"over {r['builds_on']}" for r in gains.values()],
                         showlegend=False), row=1, col=2)
    fig.add_vline(x=1.0, line_dash="dash", line_color=PEER, row=1, col=2)
    fig.update_xaxes(type="log", title_text="x over the naive loop (log scale)", row=1, col=1,
                     **log_ticks([r["cumulative"] for r in rows]))
    fig.update_xaxes(title_text="x over the stage it builds on", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(categoryorder="array", categoryarray=names, autorange="reversed", automargin=True)
    fig.update_layout(height=140 + 34 * len(rows), margin=dict(t=70, b=60, l=10, r=50),
                      title=f"{result['requests']} requests, {result['tokens']} tokens, {result['device']}")
    return fig
