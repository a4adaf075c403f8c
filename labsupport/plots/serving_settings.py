"""Notebook 06's explorer figure of every setting measured so far: one row per setting, its
throughput on the left, its latency percentiles on the right, the setting's name on the row
(read horizontally, however many settings there are), the legend below the plots.

Introduced in notebook 06 (continuous batching). A pure function: rows in, a plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .serving import POLICY_COLORS

# not prefill's orange or decode's blue: the explorer draws this below the phase timeline
LATENCIES = (("ttft_p50", "time to first token p50", "#9467bd"), ("latency_p50", "latency p50", "#17becf"),
             ("latency_p99", "latency p99", "#e377c2"), ("itl_p99", "inter-token latency p99", "#8c564b"))
# below the axis titles: placed from the bottom of the whole figure (yref "container"), in margin b
LEGEND_BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0.01, xanchor="left", x=0, font=dict(size=11))
ROW_PX = 34            # the height of one setting's row: room for its four latency bars


def settings_figure(rows: Sequence[dict], current: str | None = None, clock: str = "wall") -> go.Figure:
    """Throughput (left) and latency percentiles (right) of every setting measured so far.

    Introduced in notebook 06 (continuous batching).
    rows: dicts with "label" (the setting's name on its row), "name" (its full name, shown in
    the hover; default: the label), "policy", "throughput" (tokens per second, or per step
    with clock="steps"), "ttft_p50", "latency_p50", "latency_p99" and optionally "itl_p99"
    (seconds, or steps). The bars of `current` (a label) are drawn solid, the others faded.
    The bars are horizontal, one row per setting in the order measured, so that the names
    stay readable however many settings the learner has tried.
    """
    per, unit = ("step", "engine steps") if clock == "steps" else ("s", "seconds")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04, column_widths=[0.4, 0.6],
                        subplot_titles=(f"throughput (tokens per {per})", f"latency ({unit})"))
    labels = [r["label"] for r in rows]
    names = [r.get("name", r["label"]) for r in rows]
    opacity = [1.0 if r["label"] == current else 0.4 for r in rows]
    colors = [POLICY_COLORS.get(r.get("policy"), "#7f7f7f") for r in rows]
    fig.add_trace(go.Bar(y=labels, x=[r["throughput"] for r in rows], orientation="h",
                         marker=dict(color=colors, opacity=opacity),
                         text=[f"{r['throughput']:.2f}" for r in rows], textposition="inside", insidetextanchor="end",
                         customdata=names, name="throughput", showlegend=False,
                         hovertemplate="%{customdata}: %{x:.2f} tokens per " + per + "<extra></extra>"),
                  row=1, col=1)
    for key, name, color in LATENCIES:
        if not rows or not all(key in r for r in rows):
            continue
        fig.add_trace(go.Bar(y=labels, x=[r[key] for r in rows], orientation="h", name=name, customdata=names,
                             marker=dict(color=color, opacity=opacity),
                             hovertemplate="%{customdata}<br>" + name + ": %{x:.2f} " + unit + "<extra></extra>"),
                      row=1, col=2)
    fig.update_xaxes(title_text=f"tokens / {per}", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text=unit, rangemode="tozero", row=1, col=2)
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11), automargin=True, row=1, col=1)
    fig.update_layout(barmode="group", height=200 + ROW_PX * max(1, len(rows)), margin=dict(t=90, b=110, l=60, r=20),
                      title="every setting measured so far (the current one solid)",
                      legend=LEGEND_BELOW, bargap=0.2)
    return fig
