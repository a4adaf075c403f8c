"""Figures of the peer table, of compiled decoding and of a decode step against its bytes' floor:
pure data -> plotly figure.

Introduced in notebook 00 (where the time goes), for the bench's engines section and for
`roofline_step_gap` (which notebook 04 draws again for int4); notebook 07 (putting it together)
for its compile section.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..errors import LabError
from .layout import PHASE_COLORS


def engines_figure(section: dict) -> go.Figure:
    """Each engine's decode tokens/s (bars, labelled with the fraction of read bandwidth it
    reached; of copy bandwidth in a report made before the read probe) and its prefill time (a second axis), from the engines section's ``rows``.
    Introduced in notebook 00 (where the time goes)."""
    names = list(section["rows"])
    rows = [section["rows"][n] for n in names]
    fig = go.Figure()
    fig.add_bar(x=names, y=[r["decode_tokens_per_s"] for r in rows], name="decode tokens/s",
                marker_color=PHASE_COLORS["decode"],
                text=[f"{r['read_bandwidth_fraction']:.0%} of read bandwidth" if "read_bandwidth_fraction" in r
                      else f"{r['bandwidth_fraction']:.0%} of copy bandwidth" for r in rows], textposition="outside")
    fig.add_scatter(x=names, y=[1e3 * r["prefill_s"] for r in rows], name="prefill [ms]", yaxis="y2",
                    mode="markers", marker=dict(size=11, symbol="diamond", color=PHASE_COLORS["prefill"]))
    absent = "; ".join(f"{n}: {why}" for n, why in section.get("absent", {}).items())
    fig.update_layout(title=f"Every engine, batch 1, {section['new_tokens']} new tokens, greedy"
                            + (f"<br><sup>not measured: {absent}</sup>" if absent else ""),
                      yaxis=dict(title="decode tokens/s"), height=460, template="plotly_white",
                      yaxis2=dict(title="prefill [ms]", overlaying="y", side="right", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.3), font=dict(size=12))
    return fig


def compile_figure(section: dict) -> go.Figure:
    """Eager against compiled decode tokens/s for each (precision, batch) of the compile
    section, each compiled bar labelled with its warm-up seconds.
    Introduced in notebook 07 (putting it together)."""
    labels = [f"{r['row']}, batch {r['batch']}" for r in section["rows"]]
    labels += [f"fp32 {v['variant']}, batch {v['batch']}" for v in section.get("inductor_variants", [])
               if "skipped" not in v]
    records = section["rows"] + [v for v in section.get("inductor_variants", []) if "skipped" not in v]
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r["eager_decode_tokens_per_s"] for r in records], name="eager")
    fig.add_bar(x=labels, y=[r["compiled_decode_tokens_per_s"] for r in records], name="compiled",
                text=[f"warm-up {r['warmup_s']:.0f} s" for r in records], textposition="outside")
    fig.update_layout(title="Decode tokens/s (all rows), eager against compiled", barmode="group",
                      yaxis=dict(title="decode tokens/s"), height=440, template="plotly_white",
                      font=dict(size=12))
    return fig



def knee_figure(knee: dict) -> go.Figure:
    """Aggregate int4 decode tokens/s by rows decoding at once, one line per engine, from the engines
    section's ``decode_knee`` ({rows: {engine: {"decode_tokens_per_s": ...}}}, rows as str or int):
    where a line flattens, more rows stop paying. Introduced in notebook 00 (where the time goes)."""
    rows = sorted(knee, key=int)
    fig = go.Figure()
    for name in knee[rows[0]]:
        fig.add_scatter(x=[int(r) for r in rows], y=[knee[r][name]["decode_tokens_per_s"] for r in rows],
                        mode="lines+markers", name=name)
    fig.update_layout(title="int4 decode of many rows at once: where more rows stop paying",
                      xaxis=dict(title="rows decoding at once", type="log", tickvals=[int(r) for r in rows]),
                      yaxis=dict(title="decode tokens/s, all rows", rangemode="tozero"),
                      height=420, template="plotly_white")
    return fig

GAP_COLORS = ("#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#7f7f7f")      # in the order of roofline_step_gap.PARTS


def step_gap_figure(gaps: dict[str, dict]) -> go.Figure:
    """One horizontal bar per batch-1 decode step (`roofline_step_gap.decode_gap`), in milliseconds: the
    time its bytes take at the read bandwidth, then each part of the rest.

    Introduced in notebook 00 (where the time goes); notebook 04 (quantization) draws the int4 step,
    which is why it lives in this shared module.
    gaps: {label: result}, e.g. {"float32": ..., "int4 (W4A8)": ...}.
    """
    if not gaps:
        raise LabError("step_gap_figure needs at least one decode_gap result.")
    labels = list(gaps)
    parts = list(gaps[labels[0]]["parts"])
    fig = go.Figure()
    for part, color in zip(parts, GAP_COLORS):
        ms = [1e3 * gaps[label]["parts"][part] for label in labels]
        fig.add_trace(go.Bar(y=labels, x=ms, name=part, orientation="h", marker_color=color,
                             hovertemplate=f"{part}: %{{x:.2f}} ms per step<extra>%{{y}}</extra>"))
    fig.update_layout(barmode="stack", title="A batch-1 decode step: its bytes at the read bandwidth, and the rest",
                      xaxis=dict(title="ms per step", rangemode="tozero"),
                      height=160 + 60 * len(labels), template="plotly_white",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig
