"""Figures of notebooks 06 (continuous batching) and 06b (chunked prefill and prefix caching):
block tables into the paged pool, the slot timeline, slot use over time, cache blocks over
the run, phases and load curves, and throughput / latency per setting.

Introduced in notebook 06 (continuous batching). Pure functions: `ServingResult`s
(or the dicts of `labsupport.lab.serving_metrics`) in, plotly figures out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import PHASE_COLORS as _PHASES, legend_below, title_lines

from ..lab.serving_metrics import slot_bars, utilization_timeline

HEIGHT = 420
# one colour per request or sequence: never prefill's orange or decode's blue (`layout.PHASE_COLORS`)
PALETTE = ("#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d")
IDLE = "#d9d9d9"
POLICY_COLORS = {"static": "#d62728", "continuous": "#2ca02c"}
MARGIN = dict(t=70, b=90, l=60, r=20)


def _time_unit(clock: str) -> str:
    return "engine steps" if clock == "steps" else "time (s)"


def request_color(request_id, order: Sequence) -> str:
    """One colour per request, the same in every subplot (by its position in `order`).

    Introduced in notebook 06 (continuous batching)."""
    index = list(order).index(request_id) if request_id in order else hash(request_id)
    return PALETTE[index % len(PALETTE)]


def _run_end(result) -> float:
    return max((r.end for r in result.steps), default=0.0)


def block_table_figure(tables: Mapping[int, Sequence[int]], lengths: Mapping[int, int], num_blocks: int,
                       block_size: int, title: str | None = None) -> go.Figure:
    """Each sequence's logical blocks (top row, one group per sequence) and the physical blocks of
    the paged pool they point to (bottom row), one arrow per entry of a block table.

    Introduced in notebook 06 (continuous batching). tables: sequence -> its physical block ids
    in logical order (`BlockManager.tables`); lengths: sequence -> positions it holds (a block is
    shaded as far as it is filled); num_blocks: blocks in the pool (the unowned ones are drawn
    empty: free).
    """
    width, height, top = 0.8, 0.6, 2.0                       # a block's box, and the y of the logical row
    order = list(tables)
    color = {seq: PALETTE[k % len(PALETTE)] for k, seq in enumerate(order)}
    fig = go.Figure()
    hover_x, hover_y, hover_text = [], [], []

    def filled(seq, i):
        """Positions of logical block i of `seq` that hold something."""
        return min(block_size, max(0, lengths.get(seq, 0) - i * block_size))

    def box(x, y, seq, i, label, hover):
        """A block at (x, y), outlined and shaded as far as it is filled; i: its logical index."""
        used = 0 if seq is None else filled(seq, i)
        line = "#9e9e9e" if seq is None else color[seq]
        fig.add_shape(type="rect", x0=x - width / 2, x1=x + width / 2, y0=y - height / 2, y1=y + height / 2,
                      line=dict(color=line, width=1.5), fillcolor="white")
        if used:
            fig.add_shape(type="rect", x0=x - width / 2, x1=x - width / 2 + width * used / block_size,
                          y0=y - height / 2, y1=y + height / 2, line=dict(width=0), fillcolor=line, opacity=0.75)
        fig.add_annotation(x=x, y=y, text=label, showarrow=False, font=dict(size=11))
        hover_x.append(x), hover_y.append(y), hover_text.append(hover)

    x = 0.0
    for seq, table in tables.items():                         # the logical row: the groups side by side
        start = x
        for i, block in enumerate(table):
            first = i * block_size
            box(x, top, seq, i, f"L{i}", f"sequence {seq}, logical block {i} (positions {first}-"
                                         f"{first + filled(seq, i) - 1}) -> physical block {block}")
            # one entry of the block table: logical block i of this sequence -> physical block `block`
            fig.add_annotation(x=block, y=height / 2, ax=x, ay=top - height / 2, xref="x", yref="y",
                               axref="x", ayref="y", showarrow=True, arrowhead=2, arrowsize=1.2,
                               arrowwidth=1.5, arrowcolor=color[seq], text="")
            x += 1
        fig.add_annotation(x=(start + x - 1) / 2, y=top + height / 2 + 0.05, yanchor="bottom", showarrow=False,
                           text=f"sequence {seq}<br>{lengths.get(seq, 0)} positions", font=dict(color=color[seq], size=11))
        x += 0.7                                              # a gap between two sequences
    owner = {block: (seq, i) for seq, table in tables.items() for i, block in enumerate(table)}
    for block in range(num_blocks):                           # the physical row: the pool
        seq, i = owner.get(block, (None, 0))
        box(block, 0, seq, i, f"{block}", f"physical block {block}: free" if seq is None else
            f"physical block {block}: sequence {seq}'s logical block {i}, {filled(seq, i)} of {block_size} "
            "positions filled")
    fig.add_trace(go.Scatter(x=hover_x, y=hover_y, mode="markers", marker=dict(size=22, opacity=0),
                             hovertext=hover_text, hoverinfo="text", showlegend=False))
    right = max(num_blocks - 1, x - 1.7)
    fig.update_xaxes(range=[-0.7, right + 0.7], showgrid=False, zeroline=False, showticklabels=False)
    fig.update_yaxes(range=[-0.6, top + 1.1], showgrid=False, zeroline=False, tickvals=[0, top],
                     ticktext=[f"paged pool: {num_blocks} blocks", "block tables"])
    fig.update_layout(title=title or f"block tables: each logical block points to a physical block of "
                                     f"{block_size} positions", height=330,
                      margin=dict(t=60, b=30, l=150, r=20), plot_bgcolor="white")
    return fig


def slot_timeline_figure(results: Mapping[str, object], clock: str = "wall", title: str | None = None,
                         height: int | None = None) -> go.Figure:
    """The restaurant analogy: one row per batch slot, one bar per stay of a request in it.

    Introduced in notebook 06 (continuous batching).
    results: name -> `ServingResult` (e.g. {"static": ..., "continuous": ...}), one subplot
    each, stacked, on a shared x axis (seconds, or engine steps with clock="steps").
    A bar is coloured by request and labelled with its id; a hatched bar is a stay cut short
    by preemption (the request came back later); grey is a slot holding no useful work
    (static batching: a finished request keeping its seat until the whole batch ends).
    """
    names = list(results)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{name} batching" if name in POLICY_COLORS else name for name in names])
    order = []
    for result in results.values():
        order += [s.id for s in result.sequences if s.id not in order]
    legend_done = set()
    for row, name in enumerate(names, start=1):
        result = results[name]
        bars = slot_bars(result)
        end = _run_end(result)
        # idle: the whole run per slot, drawn underneath the bars
        slots = list(range(result.max_slots))
        fig.add_trace(go.Bar(y=[f"slot {s}" for s in slots], x=[end] * len(slots), base=[0] * len(slots),
                             orientation="h", marker_color=IDLE, name="slot idle or padding",
                             legendgroup="idle", showlegend="idle" not in legend_done,
                             hovertemplate="slot idle or computing padding<extra></extra>"),
                      row=row, col=1)
        legend_done.add("idle")
        for preempted in (False, True):
            group = [b for b in bars if b["preempted"] == preempted]
            if not group:
                continue
            label = "stay cut by preemption" if preempted else "request in a slot"
            fig.add_trace(go.Bar(
                y=[f"slot {b['slot']}" for b in group], x=[b["end"] - b["start"] for b in group],
                base=[b["start"] for b in group], orientation="h",
                marker=dict(color=[request_color(b["request"], order) for b in group],
                            line=dict(color="white", width=1),
                            pattern=dict(shape="/" if preempted else "", fgcolor="black", solidity=0.3)),
                text=[str(b["request"]) for b in group], textposition="inside", insidetextanchor="middle",
                customdata=[[b["request"], b["start"], b["end"]] for b in group],
                hovertemplate=("request %{customdata[0]}: %{customdata[1]:.2f} to %{customdata[2]:.2f}"
                               + (" (preempted)" if preempted else "") + "<extra></extra>"),
                name=label, legendgroup=label, showlegend=label not in legend_done),
                row=row, col=1)
            legend_done.add(label)
        fig.update_yaxes(categoryorder="array", categoryarray=[f"slot {s}" for s in reversed(slots)],
                         title_text="batch slot", row=row, col=1)
    fig.update_xaxes(title_text=_time_unit(clock), row=len(names), col=1)
    fig.update_layout(barmode="overlay", height=height or max(HEIGHT, 190 * len(names)),
                      title=title or "who sits in which batch slot, and when", margin=MARGIN, bargap=0.15)
    return legend_below(fig)


def utilization_figure(results: Mapping[str, object], clock: str = "wall") -> go.Figure:
    """Busy batch slots at each engine step, one line per run, against the number of slots.

    Introduced in notebook 06 (continuous batching)."""
    fig = go.Figure()
    slots = 0
    for name, result in results.items():
        t = utilization_timeline(result)
        slots = max(slots, t["max_slots"])
        xs, ys = [], []
        for start, end, busy in zip(t["start"], t["end"], t["busy_slots"]):
            xs += [start, end]
            ys += [busy, busy]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name,
                                 line=dict(color=POLICY_COLORS.get(name), width=2),
                                 hovertemplate=f"{name}: %{{y}} busy slots at %{{x:.2f}}<extra></extra>"))
    fig.add_hline(y=slots, line_dash="dot", annotation_text=f"{slots} slots")
    fig.update_layout(title="useful rows per step (the rest is idle or padding)", height=360,
                      xaxis_title=_time_unit(clock), yaxis_title="busy slots", margin=MARGIN,
                      yaxis_range=[0, slots + 0.5])
    return fig


def blocks_figure(results: Mapping[str, object], reserved_blocks: float | None = None,
                  clock: str = "wall") -> go.Figure:
    """Paged-cache blocks in use after each step, against a per-slot reservation of the
    maximum length (in blocks) as a dashed line.

    Introduced in notebook 06 (continuous batching)."""
    fig = go.Figure()
    for name, result in results.items():
        fig.add_trace(go.Scatter(x=[r.end for r in result.steps], y=[r.blocks_used for r in result.steps],
                                 mode="lines", line=dict(shape="hv", color=POLICY_COLORS.get(name), width=2),
                                 name=f"{name}: blocks in use",
                                 hovertemplate="%{y} blocks at %{x:.2f}<extra></extra>"))
    if reserved_blocks is not None:
        fig.add_hline(y=reserved_blocks, line_dash="dash", line_color="#7f7f7f",
                      annotation_text=f"reserved per slot for the longest request: {reserved_blocks:.0f} blocks")
    fig.update_layout(title="KV-cache blocks in use over the run", height=360, xaxis_title=_time_unit(clock),
                      yaxis_title="blocks in use", margin=MARGIN, yaxis_rangemode="tozero")
    return legend_below(fig)


# --- chunked prefill, prefix caching, the load curve, the decode step's cost (the engine's second half) ---

PHASE_COLORS = {**_PHASES, "cached": "#2ca02c"}          # the course's prefill and decode (layout), and the cache
CONFIG_COLORS = {"static": "#d62728", "continuous": "#2ca02c", "chunked prefill": "#17becf",
                 "chunked + prefix caching": "#9467bd", "Hugging Face": "#7f7f7f"}


def prefill_spans(result) -> list[dict]:
    """Each stay of a request in a slot split at its first token of that stay: before it the
    stay was prefilling (its prompt, in one piece or in chunks), after it decoding.

    Introduced in notebook 06 (continuous batching). Returns {"request", "slot", "start", "end"}
    of the prefill part of every stay (a stay that never emitted stays prefill to its end)."""
    spans = []
    for seq in result.sequences:
        for slot, start, end in seq.slot_spans:
            end = end if end is not None else start
            first = next((t for t in seq.token_times if t >= start), end)
            spans.append({"request": seq.id, "slot": slot, "start": start, "end": min(first, end)})
    return spans


def phase_timeline_figure(result, clock: str = "wall", title: str | None = None) -> go.Figure:
    """Two views of one run on a shared time axis. Top: the slot timeline, each stay split
    into its prefill part (orange) and its decode part (blue). Bottom: the tokens of every
    engine step, stacked: decodes, prompt tokens computed (prefill chunks) and prompt tokens
    taken from the prefix cache (hatched green: cached blocks, never computed), with the
    token budget as a dashed line when the run had one.

    Introduced in notebook 06b (chunked prefill and prefix caching). result: a `ServingResult`."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, row_heights=[0.55, 0.45],
                        subplot_titles=("who is in which slot: prefilling or decoding", "tokens of each engine step"))
    bars = slot_bars(result)
    fig.add_trace(go.Bar(y=[f"slot {b['slot']}" for b in bars], x=[b["end"] - b["start"] for b in bars],
                         base=[b["start"] for b in bars], orientation="h", name="decoding / decode tokens",
                         legendgroup="decode",
                         marker=dict(color=PHASE_COLORS["decode"], line=dict(color="white", width=1)),
                         text=[str(b["request"]) for b in bars], textposition="inside", insidetextanchor="end",
                         hovertemplate="request %{text}: in its slot from %{base:.2f}<extra></extra>"), row=1, col=1)
    spans = [s for s in prefill_spans(result) if s["end"] > s["start"]]
    fig.add_trace(go.Bar(y=[f"slot {s['slot']}" for s in spans], x=[s["end"] - s["start"] for s in spans],
                         base=[s["start"] for s in spans], orientation="h", name="prefilling / prompt tokens computed",
                         legendgroup="prefill",
                         marker=dict(color=PHASE_COLORS["prefill"], line=dict(color="white", width=1)),
                         customdata=[s["request"] for s in spans],
                         hovertemplate="request %{customdata}: prefilling until %{x:.2f} after %{base:.2f}"
                                       "<extra></extra>"), row=1, col=1)
    slots = [f"slot {s}" for s in reversed(range(result.max_slots))]
    fig.update_yaxes(categoryorder="array", categoryarray=slots, row=1, col=1)
    steps = result.steps
    mid = [(r.start + r.end) / 2 for r in steps]
    width = [max(r.end - r.start, 1e-9) for r in steps]
    below = [0] * len(steps)                                  # stacked by hand: the figure overlays its bars
    for key, name, values in (("decode", "decode tokens", [r.decode_rows for r in steps]),
                              ("prefill", "prompt tokens computed", [r.prefill_tokens for r in steps]),
                              ("cached", "prompt tokens from the prefix cache", [r.cached_tokens for r in steps])):
        base, below = below, [b + v for b, v in zip(below, values)]
        fig.add_trace(go.Bar(x=mid, y=values, base=base, width=width, name=name, legendgroup=key,
                             showlegend=key == "cached",          # the other two share the slots' entries
                             marker=dict(color=PHASE_COLORS[key], line=dict(width=0),
                                         pattern=dict(shape="/" if key == "cached" else "")),
                             hovertemplate=name + ": %{y}<extra></extra>"), row=2, col=1)
    if getattr(result, "token_budget", None):
        fig.add_hline(y=result.token_budget, line_dash="dash", line_color="#7f7f7f", row=2, col=1,
                      annotation_text=f"token budget {result.token_budget}")
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text=_time_unit(clock), row=2, col=1)
    lines = title_lines(fig, title or "prefill chunks and decode steps, and what the prefix cache saved")
    fig.update_layout(barmode="overlay", height=520 + 24 * lines, margin=dict(MARGIN, t=90 + 24 * lines))
    legend_below(fig)
    return fig


def load_curve_figure(rows: Sequence[dict], title: str | None = None) -> go.Figure:
    """The throughput-latency curve: for each configuration, one point per arrival rate, at its
    throughput (x) and its time to first token p99 (left) and inter-token latency p99 (right).

    Introduced in notebook 06b (chunked prefill and prefix caching). rows: `load_curve.load_curve`'s."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("time to first token, p99 (s)", "inter-token latency, p99 (ms)"))
    names = list(dict.fromkeys(r["configuration"] for r in rows))
    for name in names:
        points = sorted((r for r in rows if r["configuration"] == name), key=lambda r: r["rate"])
        color = CONFIG_COLORS.get(name)
        for col, key, scale in ((1, "ttft_p99", 1), (2, "itl_p99", 1e3)):
            fig.add_trace(go.Scatter(x=[p["throughput"] for p in points], y=[scale * p[key] for p in points],
                                     mode="lines+markers", name=name, legendgroup=name, showlegend=col == 1,
                                     line=dict(color=color, width=2), customdata=[p["rate"] for p in points],
                                     hovertemplate=name + ": %{customdata:.2f} requests/s -> %{x:.1f} tokens/s, "
                                                   "%{y:.2f}<extra></extra>"), row=1, col=col)
    for col in (1, 2):
        fig.update_xaxes(title_text="throughput (tokens/s)", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(height=420, margin=MARGIN,
                      title=title or "the load curve: each point one arrival rate, rising to the right")
    return legend_below(fig)


def decode_cost_figure(costs: Mapping[str, float], title: str | None = None) -> go.Figure:
    """Where a paged decode step's time goes: the shares of the block-table build, the gather
    and the rest (left), and seconds per step gathering against attending over the pool (right).

    Introduced in notebook 06 (continuous batching). costs: `decode_cost.decode_step_costs`'s dict."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.15, column_widths=[0.6, 0.4],
                        subplot_titles=("share of a decode step", "milliseconds per decode step"))
    parts = (("table_build_share", "block tables", "#9467bd"), ("gather_share", "gather of the context", "#d62728"),
             ("rest_share", "the rest (matmuls, attention, ...)", "#7f7f7f"))
    for key, name, color in parts:
        fig.add_trace(go.Bar(y=["decode step"], x=[costs[key]], orientation="h", name=name, marker_color=color,
                             text=[f"{costs[key]:.0%}"], textposition="inside",
                             hovertemplate=name + ": %{x:.1%}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=["gather, then attend", "attend over the pool"],
                         y=[1e3 * costs["step_s"], 1e3 * costs["pool_step_s"]], marker_color=["#d62728", "#2ca02c"],
                         text=[f"{1e3 * costs['step_s']:.1f}", f"{1e3 * costs['pool_step_s']:.1f}"],
                         textposition="outside", showlegend=False, cliponaxis=False), row=1, col=2)
    fig.update_xaxes(tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="ms", row=1, col=2)
    fig.update_layout(barmode="stack", height=340, margin=MARGIN,
                      title=title or (f"a decode step of {costs.get('batch_size', '?')} rows at "
                                      f"{costs.get('context', '?')} positions"))
    return legend_below(fig)
