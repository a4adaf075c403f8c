"""Figures of notebook 10 (past one device): which rank holds which weights, and what each
tensor-parallel degree measured. Introduced in notebook 10 (past one device). Pure functions:
plans and measurement dicts in, plotly figures out."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import PHASE_COLORS, legend_below

# one colour per rank: never prefill's orange or decode's blue (`layout.PHASE_COLORS`), which the handover uses
RANK_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")


def split_figure(config, shares, title: str | None = None) -> go.Figure:
    """One layer's weight matrices and the output layer, each drawn as a bar cut into the
    slices each rank holds, with where the all-reduces and the all-gather sit.
    Notebook 10 (past one device). shares: `engine.parallel.plan_split`'s."""
    D, H, KV = config.head_dim, config.num_heads, config.num_kv_heads
    matrices = [  # (label, how it is cut, [(rank, start, stop) in units of the label], units)
        ("qkv (column-parallel: queries, keys, values)", [(s.rank, s.q_heads.start, s.q_heads.stop) for s in shares], H,
         "query heads"),
        ("out (row-parallel) -> all-reduce", [(s.rank, s.q_heads.start, s.q_heads.stop) for s in shares], H,
         "query heads"),
        ("gate_up (column-parallel)", [(s.rank, s.mlp_units.start, s.mlp_units.stop) for s in shares],
         config.intermediate_size, "MLP units"),
        ("down (row-parallel) -> all-reduce", [(s.rank, s.mlp_units.start, s.mlp_units.stop) for s in shares],
         config.intermediate_size, "MLP units"),
        ("output layer (vocabulary slices) -> all-gather",
         [(s.rank, s.vocab.start, min(s.vocab.stop, config.vocab_size)) for s in shares], config.vocab_size, "words"),
    ]
    fig = go.Figure()
    for label, slices, total, unit in matrices:
        for rank, start, stop in slices:
            fig.add_trace(go.Bar(
                y=[label], x=[(stop - start) / total], base=[start / total], orientation="h",
                marker_color=RANK_COLORS[rank % len(RANK_COLORS)], name=f"rank {rank}",
                legendgroup=f"rank {rank}", showlegend=label == matrices[0][0],
                text=f"rank {rank}: {stop - start} {unit}", textposition="inside",
                hovertemplate=f"{label}<br>rank {rank}: {unit} {start}-{stop - 1}<extra></extra>"))
    fig.update_layout(barmode="overlay", height=330, margin=dict(l=10, r=10, t=60, b=40),
                      title=title or f"{config.name}, {len(shares)} ranks: {KV} key/value heads "
                                     f"({H // KV} query heads each), head size {D}",
                      xaxis=dict(title="share of the matrix's rows or columns", range=[0, 1], tickformat=".0%"),
                      yaxis=dict(autorange="reversed"))
    return fig


def degrees_figure(result: dict, title: str | None = None) -> go.Figure:
    """Decode tokens/s and prefill seconds per tensor-parallel degree, each bar split into the
    time inside the all-reduces (red) and the rest (the course's decode and prefill colours,
    `layout.PHASE_COLORS`). Notebook 10 (past one device). result:
    `lab.tensor_parallel.measure_tensor_parallel`'s."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("decode at batch 1: one step (ms)",
                                                        f"one prefill of {result['prefill_tokens']} tokens (s)"))
    labels = [f"TP={w} ({d['threads_per_rank']} thread(s) each)" for w, d in result["degrees"].items()]
    for col, (key, share_key, scale) in enumerate((("decode", "all_reduce_share_of_decode", 1e3),
                                                   ("prefill", "all_reduce_share_of_prefill", 1.0)), start=1):
        totals = [(1 / d["decode_tokens_per_s"] if key == "decode" else d["prefill_s"]) * scale
                  for d in result["degrees"].values()]
        shares = [d[share_key] for d in result["degrees"].values()]
        fig.add_trace(go.Bar(x=labels, y=[t * (1 - s) for t, s in zip(totals, shares)],
                             name=f"{key}: compute (and the rest)", marker_color=PHASE_COLORS[key]), row=1, col=col)
        fig.add_trace(go.Bar(x=labels, y=[t * s for t, s in zip(totals, shares)], name="inside the all-reduces",
                             marker_color="#d62728", showlegend=col == 1,
                             text=[f"{s:.0%}" if s else "" for s in shares], textposition="outside"), row=1, col=col)
    fig.update_layout(barmode="stack", height=380, margin=dict(l=10, r=10, t=70, b=40), legend_traceorder="normal",
                      title=title or f"tensor parallelism on {result['cores']} core(s), the same cores shared out")
    return fig


HANDOVER_PHASES = (  # (label, where the phase starts, where it ends, colour): one request's life, in order
    ("queued for rank 0", "arrival", "prefill_from", "#c7c7c7"),
    ("prefill on rank 0", "prefill_from", "first_token", PHASE_COLORS["prefill"]),
    ("handover: keys and values sent to rank 1", "first_token", "received", "#d62728"),
    ("waiting for a decode slot", "received", "seated", "#aec7e8"),        # a pale decode colour
    ("decode on rank 1", "seated", "finished", PHASE_COLORS["decode"]),
)


def handover_figure(rows: list[dict], title: str | None = None) -> go.Figure:
    """The handover drawn from a run: each request's life as one bar, queued, prefilled on rank 0,
    its KV cache in flight to rank 1, waiting for a slot, and decoded on rank 1.
    Notebook 10 (past one device). rows: `lab.tensor_parallel_disaggregated.serve_disaggregated`'s requests."""
    fig = go.Figure()
    names = [f"request {i}" for i in range(len(rows))]
    for label, begin, end, color in HANDOVER_PHASES:
        fig.add_trace(go.Bar(
            y=names, x=[max(r[end] - r[begin], 0.0) for r in rows], base=[r[begin] for r in rows],
            orientation="h", name=label, marker_color=color,
            hovertemplate=f"%{{y}}: {label}<br>%{{base:.3f}} s, for %{{x:.4f}} s<extra></extra>"))
    fig.update_layout(barmode="overlay", margin=dict(l=10, r=10, t=60),
                      title=title or "disaggregated serving: where each request spends its time",
                      xaxis=dict(title="seconds from the first arrival"), yaxis=dict(autorange="reversed"))
    legend_below(fig)                                  # under the axis title, one phase per line
    fig.update_layout(height=60 + fig.layout.margin.b + 40 + 24 * len(rows))
    return fig
