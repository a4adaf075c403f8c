"""Figures of notebook 07 (putting it together): the cumulative gain of the stacked
techniques, and each stage against the one it builds on.

Introduced in notebook 07 (putting it together). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

KEPT, NOT_KEPT, PEER, BASE = "#2ca02c", "#d62728", "#7f7f7f", "#1f77b4"


def _color(row: dict) -> str:
    if row["stage"] == "Hugging Face generate()":
        return PEER
    if row["builds_on"] is None:
        return BASE
    return KEPT if row["kept"] else NOT_KEPT


def cumulative_figure(result: dict) -> go.Figure:
    """Left: throughput of every stage over the naive loop (log y). Right: each stage's gain
    over the stage it builds on (green: kept; red: does not pay here; grey: Hugging Face).

    Introduced in notebook 07 (putting it together). result: `stack.run_stack`'s dict.
    """
    rows = result["stages"]
    names = [r["stage"] for r in rows]
    colors = [_color(r) for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.16,
                        subplot_titles=("throughput over the naive loop", "gain over the stage it builds on"))
    fig.add_trace(go.Bar(x=names, y=[r["cumulative"] for r in rows], marker_color=colors,
                         text=[f"{r['cumulative']:.1f}x" for r in rows], textposition="outside",
                         hovertext=[f"{r['tokens_per_s']:.1f} tokens/s, {r['precision']}" for r in rows],
                         showlegend=False), row=1, col=1)
    gains = [r for r in rows if r["gain"] is not None]
    fig.add_trace(go.Bar(x=[r["stage"] for r in gains], y=[r["gain"] for r in gains],
                         marker_color=[_color(r) for r in gains],
                         text=[f"{r['gain']:.2f}x" for r in gains], textposition="outside",
                         hovertext=[f"over {r['builds_on']}" for r in gains], showlegend=False), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dash", line_color=PEER, row=1, col=2)
    fig.update_yaxes(type="log", title_text="speedup over the naive loop [x, log scale]", row=1, col=1)
    fig.update_yaxes(title_text="speedup over the previous kept stage [x]", row=1, col=2)
    fig.update_xaxes(tickangle=-35)
    fig.update_layout(height=480, margin=dict(t=60, b=140, l=70, r=20),
                      title=f"{result['requests']} requests, {result['tokens']} tokens, {result['device']}")
    return fig
