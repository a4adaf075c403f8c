"""Figures of notebook 09 (serving over HTTP): latency against offered load, per server.

Introduced in notebook 09 (serving over HTTP). Pure functions: the rows of
`bench.http_serving.http_load_curve` (one per server and arrival rate) in, a plotly figure out.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

# not prefill's orange or decode's blue (`layout.PHASE_COLORS`): those mean the two phases in 06, 06b and 10
SERVER_COLORS = {"in-process engine": "#2ca02c", "our HTTP server": "#17becf", "our HTTP server (int4)": "#bcbd22",
                 "llama-server": "#d62728", "llama.cpp server": "#e377c2", "vLLM server": "#9467bd"}
MARGIN = dict(t=70, b=90, l=60, r=20)
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0)
PANELS = (("ttft_p50", "time to first token, p50 (ms)"), ("itl_p50", "inter-token latency, p50 (ms)"),
          ("throughput", "throughput (tokens/s)"))


def http_load_curve_figure(rows: Sequence[dict], title: str | None = None) -> go.Figure:
    """Latency and throughput against offered load: for each server one line over the arrival
    rates, time to first token and inter-token latency at the median (p99 on hover), and the
    throughput reached. Servers that were not measured (a row with "skipped") are left out.

    Introduced in notebook 09 (serving over HTTP). rows: dicts with "server", "rate" (requests
    per second offered), "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "throughput"."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=[name for _, name in PANELS])
    measured = [r for r in rows if not r.get("skipped")]
    for name in dict.fromkeys(r["server"] for r in measured):
        points = sorted((r for r in measured if r["server"] == name), key=lambda r: r["rate"])
        color = SERVER_COLORS.get(name)
        for col, (key, _) in enumerate(PANELS, start=1):
            scale = 1 if key == "throughput" else 1e3
            tail = key.replace("p50", "p99")
            hover = [f"p99 {scale * p[tail]:.0f}" if tail != key else "" for p in points]
            fig.add_trace(go.Scatter(x=[p["rate"] for p in points], y=[scale * p[key] for p in points],
                                     mode="lines+markers", name=name, legendgroup=name, showlegend=col == 1,
                                     line=dict(color=color, width=2), customdata=hover,
                                     hovertemplate=name + ": %{x:.2f} requests/s -> %{y:.1f} %{customdata}"
                                                          "<extra></extra>"), row=1, col=col)
    for col in range(1, len(PANELS) + 1):
        fig.update_xaxes(title_text="offered load (requests/s)", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(height=420, margin=MARGIN, legend=LEGEND_BELOW,
                      title=title or "the load curve over HTTP: the same workload at rising arrival rates")
    return fig
