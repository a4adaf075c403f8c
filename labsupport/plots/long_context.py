"""Figures of notebook 08 (long context): naive vs fused attention, the tiling picture,
attention's share of a decode step, the crossover context, kv-head variants, the window,
and one decode step's bytes and time split into weights and cache.

Introduced in notebook 08 (long context). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import LabError
from .layout import legend_below, log_ticks

MIB = 2 ** 20
WIDTH, HEIGHT = 900, 420
COLORS = {"naive": "#d62728", "fused": "#1f77b4", "weights": "#7f7f7f", "cache": "#ff7f0e"}


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    """Title, size and the legend under the plots (layout.py); `height`: the plots' own, the
    legend's lines are added to it."""
    fig.update_layout(title=title, width=WIDTH, template="plotly_white", font=dict(size=13), margin=dict(t=70))
    legend_below(fig)
    fig.update_layout(height=height + fig.layout.margin.b - 80)          # 80: plotly's default bottom margin
    return fig


def prefill_attention_figure(rows: Sequence[Mapping], budget_bytes: int) -> go.Figure:
    """Memory (MiB) and time (ms) of naive and fused prefill attention against T, log-log,
    with the memory budget. Introduced in notebook 08. rows: `prefill_attention_sweep`'s."""
    if not rows:
        raise LabError("prefill_attention_figure needs at least one row of prefill_attention_sweep.")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"memory of one layer ({rows[0]['memory']})",
                                                        "time of one layer (measured)"))
    for kind in ("naive", "fused"):
        shown = [r for r in rows if r[f"{kind}_s"] is not None]
        style = dict(mode="lines+markers", line=dict(color=COLORS[kind]))
        fig.add_trace(go.Scatter(x=[r["T"] for r in shown], y=[r[f"{kind}_bytes"] / MIB for r in shown],
                                 name=f"{kind} attention", legendgroup=kind, **style), 1, 1)
        fig.add_trace(go.Scatter(x=[r["T"] for r in shown], y=[1e3 * r[f"{kind}_s"] for r in shown],
                                 name=f"{kind} attention", legendgroup=kind, showlegend=False, **style), 1, 2)
    # the budget as a line of its own: add_hline's label would sit at 10^budget on a log axis
    fig.add_trace(go.Scatter(x=[rows[0]["T"], rows[-1]["T"]], y=[budget_bytes / MIB] * 2, mode="lines",
                             line=dict(dash="dash", color="black"), name=f"budget {budget_bytes / MIB:.0f} MiB"), 1, 1)
    lengths = [r["T"] for r in rows]                      # the measured lengths label the axis, nothing between
    fig.update_xaxes(type="log", title="prompt length T (tokens)", tickvals=lengths, ticktext=[str(t) for t in lengths])
    mib = [r[f"{k}_bytes"] / MIB for r in rows for k in ("naive", "fused")] + [budget_bytes / MIB]
    ms = [1e3 * r[f"{k}_s"] for r in rows for k in ("naive", "fused") if r[f"{k}_s"] is not None]
    fig.update_yaxes(type="log", title="MiB", row=1, col=1, **log_ticks(mib))
    fig.update_yaxes(type="log", title="ms", row=1, col=2, **log_ticks(ms))
    return _layout(fig, "Prefill attention: naive (T x T scores) vs fused (scaled_dot_product_attention)")


def tiling_figure(blocks: int = 6, row_block: int = 3) -> go.Figure:
    """The tiling idea of fused attention, on a `blocks` x `blocks` grid of score tiles (query
    blocks down, key blocks across). Introduced in notebook 08 (long context).

    Tiles above the diagonal are never computed (causal). Query block `row_block` walks
    its tiles left to right, numbered in order: only the current tile's scores exist at any
    moment, and each row keeps a running max, sum and output."""
    if not 0 <= row_block < blocks:
        raise LabError(f"row_block must be between 0 and {blocks - 1}, got {row_block}.")
    state = [[0 if key > query else (2 if query == row_block else 1) for key in range(blocks)]
             for query in range(blocks)]                       # 0 skipped, 1 other rows' tiles, 2 this row's walk
    fig = go.Figure(go.Heatmap(z=state, colorscale=[[0, "#ffffff"], [0.5, "#c6dbef"], [1, "#fd8d3c"]],
                               showscale=False, xgap=3, ygap=3, zmin=0, zmax=2))
    for key in range(row_block + 1):
        fig.add_annotation(x=key, y=row_block, text=f"step {key + 1}", showarrow=False, font=dict(size=12))
    fig.add_annotation(x=blocks - 1, y=0, text="above the diagonal: masked, never computed", showarrow=False,
                       xanchor="right", font=dict(size=11, color="#555"))
    fig.update_yaxes(autorange="reversed", title="query block (rows of Q)", tickvals=list(range(blocks)))
    fig.update_xaxes(title="key/value block (columns of K^T, rows of V)", tickvals=list(range(blocks)))
    return _layout(fig, f"Fused attention walks tile by tile: query block {row_block} holds one tile of "
                        f"scores at a time", height=480)


def decode_share_figure(rows: Sequence[Mapping]) -> go.Figure:
    """Attention's share of a decode step (measured, solid) and the cache's share of the bytes it
    reads (computed, dashed) against the context, one colour per batch. Introduced in notebook 08.
    rows: `long_context.decode_attention_share`'s."""
    fig = go.Figure()
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, batch in enumerate(sorted({r["batch"] for r in rows})):
        mine = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["context"])
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=[r["context"] for r in mine], y=[100 * r["attention_share"] for r in mine],
                                 mode="lines+markers", line=dict(color=color),
                                 name=f"batch {batch}: attention's share of the step's time (measured)"))
        fig.add_trace(go.Scatter(x=[r["context"] for r in mine],
                                 y=[100 * r["cache_bytes"] / (r["cache_bytes"] + r["weight_bytes"]) for r in mine],
                                 mode="lines", line=dict(color=color, dash="dash"),
                                 name=f"batch {batch}: the cache's share of the bytes read (computed)"))
    fig.update_xaxes(title="context (positions in each row's cache)")
    fig.update_yaxes(title="% of the decode step", range=[0, 100])
    return _layout(fig, "A decode step at long context: attention and the cache take over", height=480)


def crossover_figure(curves: Sequence[Mapping], max_context: int) -> go.Figure:
    """Bytes one decode step reads against the context: the weights (flat) and the cache at each
    batch (a line through zero), with the crossover marked. Introduced in notebook 08.
    curves: [{"model", "weight_bytes", "cache_bytes_per_token", "batches"}]."""
    fig = make_subplots(rows=1, cols=len(curves), subplot_titles=[c["model"] for c in curves])
    for col, curve in enumerate(curves, start=1):
        weights = curve["weight_bytes"] / 2**30
        fig.add_trace(go.Scatter(x=[0, max_context], y=[weights, weights], mode="lines", name="weights (every step)",
                                 line=dict(color=COLORS["weights"]), showlegend=col == 1), 1, col)
        for batch in curve["batches"]:
            per_context = batch * curve["cache_bytes_per_token"] / 2**30
            crossover = curve["weight_bytes"] / (batch * curve["cache_bytes_per_token"])
            fig.add_trace(go.Scatter(x=[0, max_context], y=[0, per_context * max_context], mode="lines",
                                     name=f"cache, batch {batch}", line=dict(dash="dot" if batch == 1 else "solid"),
                                     legendgroup=str(batch), showlegend=col == 1), 1, col)
            if crossover <= max_context:
                fig.add_trace(go.Scatter(x=[crossover], y=[weights], mode="markers+text", text=[f"{crossover:,.0f}"],
                                         textposition="top left", marker=dict(size=10, color="black"),
                                         showlegend=False), 1, col)
        fig.update_xaxes(title="context (tokens)", row=1, col=col)
    fig.update_yaxes(title="GiB read per decode step", row=1, col=1)
    return _layout(fig, "Where a decode step's reads cross over from weights to cache (computed)")


def kv_variants_figure(rows: Sequence[Mapping]) -> go.Figure:
    """Cache MiB (computed) and attention ms (measured) per kv-head variant. Introduced in
    notebook 08. rows: `long_context.time_kv_variants`'s."""
    names = [f"{r['variant']} ({r['kv_heads']} kv-heads)" for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV cache (MiB)", "decode attention (ms, measured)"))
    fig.add_trace(go.Bar(x=names, y=[r["cache_bytes"] / MIB for r in rows], marker_color=COLORS["cache"],
                         showlegend=False), 1, 1)
    fig.add_trace(go.Bar(x=names, y=[1e3 * r["attention_s"] for r in rows], marker_color=COLORS["fused"],
                         showlegend=False), 1, 2)
    return _layout(fig, "Fewer kv-heads: a smaller cache to read")


def window_figure(rows: Sequence[Mapping]) -> go.Figure:
    """Perplexity on the evaluation text against the window, and the cache a ring buffer of the
    window would need. Introduced in notebook 08. rows: `long_context.window_perplexity`'s."""
    labels = [("full" if r["window"] is None else str(r["window"])) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=labels, y=[r["cache_bytes"] / MIB for r in rows], name="cache kept (MiB, computed)",
                         marker_color=COLORS["cache"], opacity=0.5), secondary_y=True)
    fig.add_trace(go.Scatter(x=labels, y=[r["perplexity"] for r in rows], mode="lines+markers",
                             name="perplexity (measured)", line=dict(color="black")), secondary_y=False)
    fig.update_xaxes(title="sliding window W (positions each query sees)", type="category")
    fig.update_yaxes(title="perplexity (lower is better)", secondary_y=False)
    fig.update_yaxes(title="MiB", secondary_y=True)
    return _layout(fig, "Sliding-window attention: a capped cache, at a cost in quality")


def step_split_figure(bytes_per_token: Mapping, seconds_per_token: Mapping, label: str,
                      measured_s: float | None = None) -> go.Figure:
    """One decode step per generated token: bytes and time, each split into weights and cache
    (computed), with a measured time beside it when there is one. Introduced in notebook 08.
    bytes_per_token, seconds_per_token: `long_context_bytes.step_bytes` and `predicted_step_seconds`."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("MiB read per generated token",
                                                        "ms per generated token"))
    for part in ("weights", "cache"):
        fig.add_trace(go.Bar(x=[label], y=[bytes_per_token[f"{part}_per_token"] / MIB], name=part,
                             marker_color=COLORS[part], legendgroup=part), 1, 1)
        fig.add_trace(go.Bar(x=["computed"], y=[1e3 * seconds_per_token[f"{part}_per_token_s"]], name=part,
                             marker_color=COLORS[part], legendgroup=part, showlegend=False), 1, 2)
    if measured_s is not None:
        fig.add_trace(go.Bar(x=["measured"], y=[1e3 * measured_s], name="measured step / batch",
                             marker_color="black"), 1, 2)
    fig.update_layout(barmode="stack")
    return _layout(fig, f"One decode step: {label}")


def time_per_token_curve_figure(contexts: Sequence[int], predicted_s: Sequence[float],
                                measured: Sequence[tuple[int, float]] = (), highlight: int | None = None,
                                label: str = "") -> go.Figure:
    """Milliseconds per generated token against the context: the memory-bound prediction
    (a line) and the steps measured so far (dots). Introduced in notebook 08 (long context)."""
    fig = go.Figure(go.Scatter(x=list(contexts), y=[1e3 * s for s in predicted_s], mode="lines",
                               name="computed: bytes read / bandwidth", line=dict(color=COLORS["cache"])))
    if measured:
        fig.add_trace(go.Scatter(x=[c for c, _ in measured], y=[1e3 * s for _, s in measured], mode="markers",
                                 name="measured (step time / batch)", marker=dict(size=9, color="black")))
    if highlight is not None:
        fig.add_vline(x=highlight, line=dict(dash="dot", color="#555"))
    fig.update_xaxes(title="context (tokens)")
    fig.update_yaxes(title="ms per generated token", rangemode="tozero")
    return _layout(fig, f"Time per token against the context{': ' + label if label else ''}")


def bench_section_figures(section: Mapping) -> list[go.Figure]:
    """The bench section ``long_context``'s own plots (`bench.long_context`): naive vs fused
    prefill attention, and the crossover contexts. Introduced in notebook 08 (long context)."""
    return [prefill_attention_figure(section["prefill"], section["naive_budget_bytes"]),
            crossover_figure(section["crossover_curves"], max_context=32 * 1024)]
