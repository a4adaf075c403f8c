"""Figures of notebook 02 (batching): throughput and latency against batch size,
the picture of a padded batch, left padding with its mask and positions, and
labsupport against Hugging Face.

Introduced in notebook 02 (batching). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

WIDTH, HEIGHT = 900, 440
MEASURED, IDEAL = "#1f77b4", "#7f7f7f"
REAL, PADDING = "#2ca02c", "#d9d9d9"
GROUP_COLORS = ("#1f77b4", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")


def _groups(rows: Sequence[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(str(row.get("group", "measured")), []).append(row)
    return {name: sorted(members, key=lambda r: r["batch"]) for name, members in groups.items()}


def scaling_figure(rows: Sequence[dict], highlight: dict | None = None,
                   axis_batches: Sequence[int] | None = None) -> go.Figure:
    """Throughput [tokens/s] and per-token latency [ms] against batch size (log x).

    Introduced in notebook 02 (batching).
    rows: dicts with "batch", "tokens_per_s", "ms_per_token" and an optional
    "group" (one line per group, e.g. a prompt-length spread), as returned by
    `batching_timing.measure_batch`. The dashed grey lines are ideal linear scaling from
    the first group's batch-1 point: throughput batch x batch-1, latency flat.
    highlight: one row to circle (the explorer's current setting). axis_batches: batch sizes
    the axis spans and labels besides those measured; it starts at the smallest, batch 1.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.13,
                        subplot_titles=("throughput (all rows together)", "latency (one row's next token)"))
    groups = _groups(rows)
    for index, (name, members) in enumerate(groups.items()):
        batches = [r["batch"] for r in members]
        style = dict(mode="lines+markers", legendgroup=name,
                     line=dict(color=GROUP_COLORS[index % len(GROUP_COLORS)], width=2))
        fig.add_trace(go.Scatter(x=batches, y=[r["tokens_per_s"] for r in members], name=name,
                                 hovertemplate="batch %{x}: %{y:.1f} tokens/s<extra></extra>", **style),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=batches, y=[r["ms_per_token"] for r in members], name=name,
                                 showlegend=False,
                                 hovertemplate="batch %{x}: %{y:.1f} ms per token<extra></extra>", **style),
                      row=1, col=2)
    first = next(iter(groups.values()), [])
    if first:
        base = first[0]
        xs = sorted({r["batch"] for r in rows})
        per_row = base["tokens_per_s"] / base["batch"]
        ideal = dict(mode="lines", line=dict(color=IDEAL, dash="dash"), legendgroup="ideal")
        fig.add_trace(go.Scatter(x=xs, y=[per_row * b for b in xs], name="ideal: batch 1 x batch size",
                                 hovertemplate="ideal at batch %{x}: %{y:.1f} tokens/s<extra></extra>",
                                 **ideal), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[base["ms_per_token"]] * len(xs), name="ideal: batch 1",
                                 showlegend=False,
                                 hovertemplate="batch 1 latency: %{y:.1f} ms<extra></extra>", **ideal),
                      row=1, col=2)
    if highlight is not None:
        marker = dict(size=16, color="rgba(0,0,0,0)", line=dict(color="black", width=2))
        for col, key in ((1, "tokens_per_s"), (2, "ms_per_token")):
            fig.add_trace(go.Scatter(x=[highlight["batch"]], y=[highlight[key]], mode="markers",
                                     marker=marker, name="current setting", legendgroup="current",
                                     showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
    ticks = sorted(set(axis_batches or []) | {r["batch"] for r in rows}) or [1]
    span = [math.log10(ticks[0]) - 0.08, math.log10(max(ticks[-1], 2 * ticks[0])) + 0.08]   # log10 units
    for col in (1, 2):
        fig.update_xaxes(type="log", title="batch size [sequences]", range=span, tickvals=ticks,
                         ticktext=[str(b) for b in ticks], row=1, col=col)
    # Minor tick labels 2 and 5 only: over a short range plotly labels every digit (2..9),
    # which piles up on a small plot.
    fig.update_yaxes(type="log", title="throughput [tokens/s]", dtick="D2", row=1, col=1)
    fig.update_yaxes(title="time per token [ms]", rangemode="tozero", row=1, col=2)
    fig.update_layout(width=WIDTH, height=HEIGHT, template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    return fig


def _batch_rows(batches: Sequence[Sequence[int]]) -> tuple[list[str], list[int], list[int]]:
    """Row labels, padding and real tokens of every prompt, batch after batch."""
    labels, padding, real = [], [], []
    for b, lengths in enumerate(batches):
        width = max(lengths)
        for r, length in enumerate(lengths):
            labels.append(f"batch {b + 1} · row {r + 1}" if len(batches) > 1 else f"row {r + 1}")
            padding.append(width - length)
            real.append(length)
    return labels, padding, real


def _waste(batches: Sequence[Sequence[int]]) -> float:
    slots = sum(len(b) * max(b) for b in batches)
    return 1.0 - sum(sum(b) for b in batches) / slots


def padding_figure(batches: Sequence[Sequence[int]], sorted_batches: Sequence[Sequence[int]] | None = None,
                   titles: tuple[str, str] = ("as they come", "sorted by length")) -> go.Figure:
    """Each prompt as a bar: padding on the left (grey), real tokens on the right (green).

    Introduced in notebook 02 (batching).
    batches: lists of prompt lengths, one list per batch (each batch is padded to its
    longest prompt). sorted_batches: the same prompts regrouped (e.g. by
    `batching.sorted_batches`), drawn in a second panel. Titles give the waste.
    """
    panels = [batches] + ([sorted_batches] if sorted_batches is not None else [])
    names = [f"{t}: {_waste(p):.0%} padding" for t, p in zip(titles, panels)]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=names, horizontal_spacing=0.16)
    for col, panel in enumerate(panels, start=1):
        labels, padding, real = _batch_rows(panel)
        fig.add_trace(go.Bar(y=labels, x=padding, orientation="h", name="padding", marker_color=PADDING,
                             legendgroup="padding", showlegend=col == 1,
                             hovertemplate="%{y}: %{x} padding tokens<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Bar(y=labels, x=real, orientation="h", name="prompt tokens", marker_color=REAL,
                             legendgroup="real", showlegend=col == 1,
                             hovertemplate="%{y}: %{x} prompt tokens<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(title="token slots in the prefill [tokens]", row=1, col=col)
    # 22 px per row inside the plot (plus the margins): fewer and plotly skips every other row label.
    height = min(900, max(300, 190 + 22 * max(len(_batch_rows(p)[0]) for p in panels)))
    # The legend on the right: above the plot it ran into the panel titles.
    fig.update_layout(barmode="stack", width=WIDTH, height=height, template="plotly_white",
                      font=dict(size=13), legend=dict(orientation="v", yanchor="top", y=1, x=1.02,
                                                      xanchor="left"))
    return fig


def peer_figure(tokens_per_s: dict[str, float], title: str = "") -> go.Figure:
    """Bars of tokens/s for engines run side by side on the same batch (e.g. labsupport, HF).

    Introduced in notebook 02 (batching).
    """
    names = list(tokens_per_s)
    values = [tokens_per_s[n] for n in names]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=GROUP_COLORS[: len(names)],
                           text=[f"{v:.1f}" for v in values], textposition="outside",
                           hovertemplate="%{x}: %{y:.1f} tokens/s<extra></extra>"))
    fig.update_yaxes(title="throughput [tokens/s]", rangemode="tozero")
    fig.update_layout(title=title, width=600, height=380, template="plotly_white", font=dict(size=13))
    return fig


def left_padding_figure(padded, token_text: Sequence[Sequence[str]] | None = None) -> go.Figure:
    """A left-padded batch as three grids, one cell per token slot: the tokens, the attention
    mask and the position ids; padding grey, real tokens green.

    Introduced in notebook 02 (batching). padded: a `padding.PaddedBatch` (tokens,
    attention_mask, positions, each (batch, T)). token_text: what to write in each token
    cell instead of its id (e.g. the decoded tokens), one list per row.
    """
    tokens = padded.tokens.tolist()                                       # (batch, T)
    mask = padded.attention_mask.bool().tolist()                          # (batch, T)
    positions = padded.positions.tolist()                                 # (batch, T)
    batch, width = len(tokens), len(tokens[0])
    token_text = token_text or [[str(t) for t in row] for row in tokens]
    rows = [f"row {r}: {sum(m)} tokens" for r, m in enumerate(mask)]
    panels = (("tokens", token_text),
              ("attention mask", [[str(int(m)) for m in row] for row in mask]),
              ("position ids", [[str(p) if m else f"({p})" for p, m in zip(prow, mrow)]
                                for prow, mrow in zip(positions, mask)]))
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[name for name, _ in panels])
    z = [[int(m) for m in row] for row in mask]                          # 0 padding, 1 real token
    for col, (name, text) in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(z=z, x=list(range(width)), y=rows, zmin=0, zmax=1, showscale=False,
                                 colorscale=[[0, PADDING], [1, REAL]], xgap=2, ygap=2, text=text,
                                 texttemplate="%{text}", textfont=dict(size=12),
                                 hovertemplate=f"%{{y}}, slot %{{x}}: {name} %{{text}}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title="slot", dtick=1, row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.add_annotation(text="Grey: padding, hidden from every query by the mask; a position there only has to "
                            "be a valid id (in brackets).<br>Every prompt ends in the last column, where the next "
                            "token goes; positions count each row's real tokens from 0.",
                       xref="paper", yref="paper", x=0, y=0, yshift=-60, yanchor="top", xanchor="left",
                       align="left", showarrow=False)
    fig.update_layout(title=f"Left padding: {batch} prompts of {[sum(m) for m in mask]} tokens, padded to {width}",
                      width=WIDTH, height=230 + 34 * batch, template="plotly_white", font=dict(size=13),
                      margin=dict(b=120))
    return fig
