"""Notebook 06's explorer figure of every setting measured so far: throughput on top, latency
percentiles below, one short category label per setting (its full name in the hover), the
legend beside the plot, where it overlaps neither a title nor a tick label.

Introduced in notebook 06 (continuous batching). A pure function: rows in, a plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .serving import POLICY_COLORS

LATENCIES = (("ttft_p50", "time to first token p50", "#9467bd"), ("latency_p50", "latency p50", "#1f77b4"),
             ("latency_p99", "latency p99", "#ff7f0e"), ("itl_p99", "inter-token latency p99", "#8c564b"))
# the legend right of the plots, level with the latency panel; the right margin holds it
LEGEND_RIGHT = dict(orientation="v", yanchor="top", y=0.42, xanchor="left", x=1.02, font=dict(size=11))


def settings_figure(rows: Sequence[dict], current: str | None = None, clock: str = "wall") -> go.Figure:
    """Throughput (top) and latency percentiles (bottom) of every setting measured so far.

    Introduced in notebook 06 (continuous batching).
    rows: dicts with "label" (a short category name, a few lines joined by <br>), "name" (the
    setting's full name, shown in the hover; default: the label), "policy", "throughput"
    (tokens per second, or per step with clock="steps"), "ttft_p50", "latency_p50",
    "latency_p99" and optionally "itl_p99" (seconds, or steps). The bars of `current` (a
    label) are drawn solid, the others faded. The category labels stay horizontal: a label
    rotated to fit is cut off at a laptop's width.
    """
    per, unit = ("step", "engine steps") if clock == "steps" else ("s", "seconds")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(f"throughput (tokens per {per})", f"latency ({unit})"))
    labels = [r["label"] for r in rows]
    names = [r.get("name", r["label"]).replace("<br>", " ") for r in rows]
    opacity = [1.0 if r["label"] == current else 0.4 for r in rows]
    colors = [POLICY_COLORS.get(r.get("policy"), "#1f77b4") for r in rows]
    fig.add_trace(go.Bar(x=labels, y=[r["throughput"] for r in rows], marker=dict(color=colors, opacity=opacity),
                         text=[f"{r['throughput']:.2f}" for r in rows], textposition="outside", cliponaxis=False,
                         customdata=names, name="throughput", showlegend=False,
                         hovertemplate="%{customdata}: %{y:.2f} tokens per " + per + "<extra></extra>"),
                  row=1, col=1)
    for key, name, color in LATENCIES:
        if not rows or not all(key in r for r in rows):
            continue
        fig.add_trace(go.Bar(x=labels, y=[r[key] for r in rows], name=name, customdata=names,
                             marker=dict(color=color, opacity=opacity),
                             hovertemplate="%{customdata}<br>" + name + ": %{y:.2f} " + unit + "<extra></extra>"),
                      row=2, col=1)
    fig.update_yaxes(title_text=f"tokens / {per}", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=unit, rangemode="tozero", row=2, col=1)
    fig.update_xaxes(tickangle=0, tickfont=dict(size=11), automargin=True, row=2, col=1)
    fig.update_layout(barmode="group", height=560, margin=dict(t=80, b=40, l=60, r=190),
                      title="every setting measured so far (the current one solid; hover for its full name)",
                      legend=LEGEND_RIGHT, bargap=0.25)
    return fig
