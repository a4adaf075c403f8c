"""Notebook 05's optimal-k figure: the expected speedup against k from this run's measurements.

Introduced in notebook 05 (speculative decoding). A pure function: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping

import plotly.graph_objects as go

from .layout import legend_below

from ..errors import LabError


def k_curve_figure(curves: Mapping[str, Mapping[int, float]], best: Mapping[str, int], used_k: int,
                   title: str = "") -> go.Figure:
    """Expected speedup over plain decoding against k, one line per curve ({name: {k: speedup}}),
    each curve's best k marked, the k the notebook ran with drawn as a dotted line and 1x as a
    dashed one. Notebook 05 (speculative decoding)."""
    if not curves:
        raise LabError("k_curve_figure needs at least one curve.")
    fig = go.Figure()
    for name, curve in curves.items():
        ks = sorted(curve)
        fig.add_trace(go.Scatter(x=ks, y=[curve[k] for k in ks], mode="lines+markers", name=name))
        k = best[name]
        fig.add_trace(go.Scatter(x=[k], y=[curve[k]], mode="markers+text", text=[f"best k = {k}"],
                                 textposition="top center", marker=dict(size=14, symbol="star"),
                                 showlegend=False, hoverinfo="skip"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#999999", annotation_text="plain decoding")
    fig.add_vline(x=used_k, line_dash="dot", line_color="#999999", annotation_text=f"k = {used_k} above")
    fig.update_layout(title=title or "expected speedup against k, from this run's alpha, c and v(k)",
                      xaxis_title="k, tokens drafted per step", yaxis_title="expected speedup (x)",
                      template="plotly_white", margin=dict(t=60, l=60, r=30))
    legend_below(fig)                                       # under the plot: never on the title (layout.py)
    fig.update_layout(height=320 + fig.layout.margin.b)
    return fig
