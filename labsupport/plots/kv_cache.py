"""Figures of notebook 01 (KV cache): step time against position, total time
against tokens generated, cache memory against sequence length, and the layout of
the cache itself (what one decode step writes).

Introduced in notebook 01 (KV cache). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..errors import LabError
from ..engine.hardware import dtype_name
from ..engine.kv_cache import kv_cache_bytes
from ..lab.kv_cache_timing import estimated_step_seconds
from ..engine.config import ModelConfig
from .layout import legend_below

MIB = 2 ** 20
COLORS = {"naive_s": "#d62728", "cached_s": "#1f77b4"}
LABELS = {"naive_s": "without cache (re-run the whole sequence)", "cached_s": "with KV cache (one new token)"}
WIDTH, HEIGHT = 900, 420


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    """Titles, size, and the legend under the plot (layout.py), its lines added to HEIGHT."""
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, width=WIDTH,
                      template="plotly_white", font=dict(size=14), margin=dict(t=60))
    legend_below(fig, extra_px=6)                              # font 14: a little more room for the axis
    fig.update_layout(height=HEIGHT + fig.layout.margin.b - 80)
    return fig


def per_token_time_figure(rows: Sequence[dict], highlight: dict | None = None) -> go.Figure:
    """Milliseconds per generated token against the tokens already in the sequence.

    Introduced in notebook 01 (KV cache). rows: those of
    `kv_cache_timing.time_per_token_by_position` (either or both of naive_s / cached_s).
    highlight: an optional {"sequence_length": ..., "seconds": ..., "label": ...} point.
    """
    fig = go.Figure()
    rows = sorted(rows, key=lambda r: r["sequence_length"])
    for name in ("naive_s", "cached_s"):
        points = [r for r in rows if name in r]
        if points:
            fig.add_trace(go.Scatter(
                x=[r["sequence_length"] for r in points], y=[1e3 * r[name] for r in points],
                mode="lines+markers", name=LABELS[name], line=dict(color=COLORS[name])))
    if highlight is not None:
        fig.add_trace(go.Scatter(
            x=[highlight["sequence_length"]], y=[1e3 * highlight["seconds"]], mode="markers",
            name=highlight.get("label", "current setting"),
            marker=dict(size=16, symbol="star", color="black")))
    # From zero: the explorer starts with a single measured point, which would otherwise
    # get a range of +-1 ms around it.
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, "Time to generate one token", "tokens already in the sequence",
                   "time per token (ms)")


def cumulative_time_figure(rows: Sequence[dict], new_tokens: int,
                           measured_totals: Mapping[int, Mapping[str, float]] | None = None) -> go.Figure:
    """Total seconds to generate 1 .. new_tokens tokens: the running sum of per-step times.

    Introduced in notebook 01 (KV cache). The curves are estimates from the
    measured steps (`kv_cache_timing.estimated_step_seconds`);
    measured_totals, {new_tokens: {"naive_s": s, "cached_s": s}}, adds full runs as markers.
    """
    counts = np.arange(1, new_tokens + 1)
    fig = go.Figure()
    for name in ("naive_s", "cached_s"):
        if rows and all(name in r for r in rows):
            per_step = estimated_step_seconds(rows, name, new_tokens)
            fig.add_trace(go.Scatter(x=counts, y=np.cumsum(per_step), mode="lines",
                                     name=LABELS[name] + ", estimated", line=dict(color=COLORS[name])))
    for n, totals in sorted((measured_totals or {}).items()):
        for name, seconds in totals.items():
            fig.add_trace(go.Scatter(x=[n], y=[seconds], mode="markers", showlegend=False,
                                     name=f"{LABELS[name]}, measured full run",
                                     marker=dict(size=12, symbol="diamond", color=COLORS[name])))
    return _layout(fig, "Total generation time (markers: measured full runs)",
                   "tokens generated", "total time (s)")


def cache_memory_figure(config: ModelConfig, lengths: Sequence[int],
                        measured: Sequence[tuple[int, int]] = (), batch_size: int = 1,
                        dtype: torch.dtype = torch.float32, highlight_length: int | None = None) -> go.Figure:
    """KV cache size in MiB against sequence length: the formula for this model's
    grouped-query heads and for full multi-head attention, plus measured allocations.

    Introduced in notebook 01 (KV cache). measured: (length, bytes) pairs, e.g.
    ``StaticKVCache(...).nbytes``; they sit on the formula's line.
    """
    lengths = sorted(lengths)
    full_mha = config.with_(num_kv_heads=config.num_heads)
    fig = go.Figure()
    if config.num_kv_heads != config.num_heads:
        fig.add_trace(go.Scatter(
            x=lengths, y=[kv_cache_bytes(full_mha, n, batch_size, dtype) / MIB for n in lengths],
            mode="lines", name=f"formula, full multi-head ({config.num_heads} kv heads)",
            line=dict(color="#7f7f7f", dash="dash")))
    fig.add_trace(go.Scatter(
        x=lengths, y=[kv_cache_bytes(config, n, batch_size, dtype) / MIB for n in lengths],
        mode="lines", name=f"formula, this model ({config.num_kv_heads} kv heads)",
        line=dict(color=COLORS["cached_s"])))
    if measured:
        fig.add_trace(go.Scatter(
            x=[n for n, _ in measured], y=[b / MIB for _, b in measured], mode="markers",
            name="measured allocation", marker=dict(size=11, color="black", symbol="circle-open",
                                                    line=dict(width=2))))
    if highlight_length is not None:
        fig.add_vline(x=highlight_length, line=dict(color="black", dash="dot"))
    return _layout(fig, f"KV cache memory ({dtype_name(dtype)}, batch {batch_size})",
                   "sequence length (tokens)", "cache size (MiB)")


# --- the layout of the cache, and what one decode step writes ------------------------------

SLOT_COLORS = ((0, "#eeeeee"), (1, "#1f77b4"), (2, "#ff7f0e"))     # empty, cached, written by this step
SLOT_NAMES = ("preallocated, still empty", "cached (written by earlier steps)", "written by this decode step")


def _layout_rows(config: ModelConfig, batch: int, layers_shown: int) -> list[tuple[str, int | None]]:
    """(label, layer) per heatmap row: the first `layers_shown` layers and the last, a gap row between."""
    shown = list(range(min(layers_shown, config.num_layers)))
    if config.num_layers - 1 not in shown:
        shown.append(config.num_layers - 1)
    rows = []
    for index, layer in enumerate(shown):
        if index > 0 and layer != shown[index - 1] + 1:
            rows.append((f"⋮ layers {shown[index - 1] + 1}-{layer - 1}", None))
        for b in range(batch):
            for head in range(config.num_kv_heads):
                row = f" · row {b}" if batch > 1 else ""
                rows.append((f"layer {layer}{row} · kv head {head}", layer))
    return rows


def kv_layout_figure(config: ModelConfig, filled: int = 6, max_len: int = 10, batch: int = 1,
                     layers_shown: int = 2) -> go.Figure:
    """The cache's keys and values as grids of (layer, kv head) rows by position columns, and the
    column one decode step writes.

    Introduced in notebook 01 (KV cache). Each of ``keys`` and ``values`` is a tensor
    (layers, batch, kv_heads, max_len, head_dim): a cell here is one head's vector of
    head_dim numbers at one position. Positions 0 .. filled - 1 are cached, position
    `filled` is written by this decode step, the rest is preallocated and empty. The first
    `layers_shown` layers and the last are drawn; a gap row stands for the others.
    """
    if not 0 <= filled < max_len:
        raise LabError(f"kv_layout_figure needs 0 <= filled < max_len (a free slot for the new token), "
                       f"got filled={filled}, max_len={max_len}.")
    rows = _layout_rows(config, batch, layers_shown)
    labels = [label for label, _ in rows]
    state = [0] * max_len
    state[:filled] = [1] * filled
    state[filled] = 2
    z = [state if layer is not None else [None] * max_len for _, layer in rows]         # (rows, max_len)
    hover = [[f"{label}, position {p}: {config.head_dim} numbers, {SLOT_NAMES[s]}" for p, s in enumerate(state)]
             for label in labels]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04)
    top = len(SLOT_COLORS) - 1
    scale = [[value / top, color] for value, color in SLOT_COLORS]
    for col, name in ((1, "keys"), (2, "values")):
        fig.add_trace(go.Heatmap(z=z, x=list(range(max_len)), y=labels, zmin=0, zmax=top, colorscale=scale,
                                 showscale=False, xgap=2, ygap=2, hoverinfo="text", text=hover), row=1, col=col)
        fig.update_xaxes(title=f"<b>{name}</b>: position in the sequence", dtick=1, row=1, col=col)
    for (_, color), name in zip(SLOT_COLORS, SLOT_NAMES):         # legend entries for the three colours
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, marker=dict(
            size=13, symbol="square", color=color, line=dict(color="#999999", width=1))))
    fig.update_yaxes(autorange="reversed")
    per_token = config.kv_values_per_token
    note = (f"Each cell: one kv head's vector of head_dim = {config.head_dim} numbers at one position.<br>"
            "One decode step writes one column (orange) in every layer and kv head, keys and values alike:<br>"
            f"2 x {config.num_layers} layers x {config.num_kv_heads} kv heads x {config.head_dim} = "
            f"{per_token:,} numbers per token and row.")
    fig.add_annotation(text=note,
                       xref="paper", yref="paper", x=0, y=0, yshift=-70, yanchor="top", showarrow=False,
                       xanchor="left", align="left")
    height = 60 + 26 * len(rows)                                    # the grids themselves
    fig.update_layout(title=f"KV cache layout: keys and values, each a tensor<br>(layers={config.num_layers}, "
                            f"batch={batch}, kv_heads={config.num_kv_heads}, positions={max_len}, "
                            f"head_dim={config.head_dim})",
                      width=WIDTH, height=height + 260, template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, xanchor="left"),
                      margin=dict(t=150, b=150))
    return fig
