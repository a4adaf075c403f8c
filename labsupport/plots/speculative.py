"""Figures of notebook 05 (speculative decoding): one verify pass drawn step by step, the
speed of each method, where a step's time goes, acceptance, and the sampling experiment.

Introduced in notebook 05 (speculative decoding). Pure functions: data in, plotly figure out.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import LabError
from .layout import legend_below, title_lines

HEIGHT = 320
COLORS = {"context": "#dddddd", "pending": "#bbbbbb", "drafted": "#fdd49e", "accepted": "#2ca02c",
          "rejected": "#d62728", "unchecked": "#999999", "corrected": "#ff7f0e", "resampled": "#ff7f0e",
          "bonus": "#1f77b4", "cache": "#9ecae1", "rolled back": "#ffffff"}
CURRENT, OTHER = "#d62728", "#1f77b4"


def _layout(fig: go.Figure, title: str, height: int = HEIGHT, right: int = 30) -> go.Figure:
    """Title, size and legend (under the plots: layout.py); `right`: the margin for a reference
    line's label. The height given is the plots' own: the legend's lines are added to it."""
    lines = title_lines(fig, title)                 # "<br>" starts a subtitle (layout.py)
    fig.update_layout(template="plotly_white", margin=dict(t=60 + 22 * lines, l=60, r=right))
    legend_below(fig)
    fig.update_layout(height=height + fig.layout.margin.b + 22 * lines)
    return fig


# --- one verify pass, drawn ---------------------------------------------------------------

def _box(fig, x: float, y: float, text: str, color: str, hover: str, dash: bool = False, strike: bool = False):
    """One token as a labelled box centred at (x, y)."""
    fig.add_shape(type="rect", x0=x - 0.45, x1=x + 0.45, y0=y - 0.32, y1=y + 0.32, fillcolor=color,
                  opacity=0.85, line=dict(color="#555555", width=1, dash="dot" if dash else "solid"))
    label = f"<s>{text}</s>" if strike else text
    fig.add_annotation(x=x, y=y, text=label, showarrow=False, font=dict(size=12), hovertext=hover)


def verify_pass_figure(context: Sequence[str], drafted: Sequence[str], target_choice: Sequence[str],
                       n_accepted: int) -> go.Figure:
    """A diagram of one step of greedy speculative decoding, row by row.

    Introduced in notebook 05 (speculative decoding). context: the last few tokens as text,
    the last one "pending" (not yet in the target's KV cache); drafted: the k drafted
    tokens; target_choice: the target's own choice at each of the k + 1 positions of its
    one pass over [pending, d_1..d_k]; n_accepted: how many drafts matched. Rows: what the
    draft proposes; what the target reads in one pass; what it predicts (position i, an
    arrow, predicts the token after it, so it checks d_(i+1)); what is kept (the accepted
    prefix plus the target's correction, or its bonus token after k matches); the KV cache
    after the rollback.
    """
    k = len(drafted)
    if not context or len(target_choice) != k + 1 or not 0 <= n_accepted <= k:
        raise LabError(f"verify_pass_figure needs a context, k + 1 = {k + 1} target choices and "
                       f"0 <= n_accepted <= {k}; got {len(target_choice)} choices, n_accepted={n_accepted}.")
    fig = go.Figure()
    before, pending = list(context[:-1]), context[-1]
    x0 = -len(before)                                   # the pending token sits at x = 0
    rows = {"draft proposes": 4, "target reads (one pass)": 3, "target predicts": 2, "kept": 1,
            "KV cache after": 0}
    for label, y in rows.items():
        fig.add_annotation(x=x0 - 0.7, y=y, text=f"<b>{label}</b>", showarrow=False, xanchor="right")
    for i, token in enumerate(before):                  # the context: in the cache already
        _box(fig, x0 + i, 4, token, COLORS["context"], "context")
        _box(fig, x0 + i, 3, token, COLORS["cache"], "in the cache: not fed again")
        _box(fig, x0 + i, 0, token, COLORS["cache"], "in the cache")
    _box(fig, 0, 4, pending, COLORS["pending"], "pending: the last token, not yet in the cache")
    for i, token in enumerate(drafted, start=1):
        missed = i == n_accepted + 1
        _box(fig, i, 4, token, COLORS["rejected"] if missed else COLORS["drafted"],
             f"d{i}: drafted" + (", the first miss: rejected" if missed else ""), strike=missed)
    for i, fed in enumerate([pending, *drafted]):       # one pass over k + 1 tokens
        _box(fig, i, 3, fed, COLORS["pending"] if i == 0 else COLORS["drafted"], f"position {i}: fed")
        fig.add_annotation(x=i + 1, y=2.3, ax=i, ay=2.7, xref="x", yref="y", axref="x", ayref="y", text="",
                           showarrow=True, arrowhead=2, arrowwidth=1, arrowcolor="#666666")
    kind = "bonus" if n_accepted == k else "corrected"
    for i, choice in enumerate(target_choice):          # the prediction at position i checks d_(i+1)
        status = "accepted" if i < n_accepted else (kind if i == n_accepted else "unchecked")
        hover = (f"position {i} predicts the token after it: " +
                 (f"d{i + 1} {'matches' if i < n_accepted else 'differs'}" if i < k else "the bonus token"))
        _box(fig, i + 1, 2, choice, COLORS[status], hover if i <= n_accepted else "after the first miss: unused",
             dash=status == "unchecked")
    for i in range(1, n_accepted + 1):                  # kept: the matching prefix, then the target's token
        _box(fig, i, 1, drafted[i - 1], COLORS["accepted"], f"d{i}: accepted")
    _box(fig, n_accepted + 1, 1, target_choice[n_accepted], COLORS[kind],
         f"{kind}: the target's own choice at position {n_accepted}")
    _box(fig, 0, 0, pending, COLORS["cache"], "written by this pass, kept")
    for i in range(1, k + 1):                           # the cache: truncate past the accepted drafts
        kept = i <= n_accepted
        _box(fig, i, 0, drafted[i - 1], COLORS["cache"] if kept else COLORS["rolled back"],
             "written by this pass, kept" if kept else "written by this pass, rolled back (truncate)",
             dash=not kept, strike=not kept)
    fig.add_annotation(x=k + 0.7, y=0, text=f"+{n_accepted + 1} in the cache; the {kind} token<br>is fed "
                                            "with the next pass", showarrow=False, xanchor="left", font=dict(size=11))
    fig.update_xaxes(visible=False, range=[x0 - 4.5, k + 4.5])
    fig.update_yaxes(visible=False, range=[-0.6, 4.6])
    return _layout(fig, f"One verify pass: k = {k} drafts, one target pass, {n_accepted} accepted + 1 {kind}"
                        "<br>the target reads k + 1 positions at once. green: its choice matches the draft; "
                        "red: the first miss;<br>orange: its correction; blue box: bonus; grey dashed: never used; "
                        "light blue: in the KV cache", height=420)


# --- measurements ---------------------------------------------------------------------------

def speed_figure(tokens_per_s: Mapping[str, float], baseline: str = "plain", title: str = "") -> go.Figure:
    """Tokens per second of each method, labelled with its speedup over `baseline`.

    Introduced in notebook 05 (speculative decoding)."""
    if baseline not in tokens_per_s:
        raise LabError(f"speed_figure needs the baseline {baseline!r} among {list(tokens_per_s)}.")
    names = list(tokens_per_s)
    fig = go.Figure(go.Bar(x=names, y=[tokens_per_s[n] for n in names], marker_color=OTHER,
                           text=[f"{tokens_per_s[n] / tokens_per_s[baseline]:.2f}x" for n in names]))
    fig.update_yaxes(title="tokens/s", rangemode="tozero")
    return _layout(fig, title or "decode speed (higher is better); labels: speedup over plain decoding")


def pass_cost_figure(rows: Sequence[dict]) -> go.Figure:
    """Where one speculative step's time goes, in plain decode steps, and what it earns.

    Introduced in notebook 05 (speculative decoding). rows: {"label", "draft_per_pass",
    "verify_per_pass", "tokens_per_pass"}. A step pays the stacked bar (drafting, then the
    verify pass) and yields the diamond's tokens; plain decoding pays 1 step per token, so
    a diamond above its bar means a speedup (tokens per pass / cost per pass).
    """
    labels = [r["label"] for r in rows]
    fig = go.Figure([
        go.Bar(x=labels, y=[r["draft_per_pass"] for r in rows], name="drafting, per step", marker_color="#fdae6b"),
        go.Bar(x=labels, y=[r["verify_per_pass"] for r in rows], name="verify pass (k + 1 tokens)",
               marker_color="#6baed6"),
        go.Scatter(x=labels, y=[r["tokens_per_pass"] for r in rows], mode="markers", name="tokens per step",
                   marker=dict(symbol="diamond", size=14, color="black"))])
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="one plain step", annotation_position="right")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="plain decode steps", rangemode="tozero")
    return _layout(fig, "one speculative step: its cost and its tokens, in plain decode steps", height=360,
                   right=110)


def acceptance_figure(labels: Sequence[str], acceptance: Sequence[float], tokens_per_pass: Sequence[float],
                      current: int | None = None) -> go.Figure:
    """Two panels: the acceptance rate (a fraction) and the tokens per target pass (a count).

    Introduced in notebook 05 (speculative decoding). current: the index of the setting
    drawn in red (the explorer's latest)."""
    colors = [CURRENT if i == current else OTHER for i in range(len(labels))]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance rate", "tokens per target pass"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Bar(x=list(labels), y=list(acceptance), marker_color=colors, showlegend=False,
                         text=[f"{a:.2f}" for a in acceptance]), row=1, col=1)
    fig.add_trace(go.Bar(x=list(labels), y=list(tokens_per_pass), marker_color=colors, showlegend=False,
                         text=[f"{t:.2f}" for t in tokens_per_pass]), row=1, col=2)
    fig.update_yaxes(title="fraction of drafted tokens kept", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title="tokens", rangemode="tozero", row=1, col=2)
    return _layout(fig, "what the target kept")


def speedup_figure(labels: Sequence[str], measured: Sequence[float], predicted: Sequence[float],
                   predicted_free_pass: Sequence[float] | None = None, current: int | None = None) -> go.Figure:
    """Measured speedup over plain decoding beside Leviathan et al.'s prediction from the
    measured acceptance, draft cost and verify-pass cost (and, optionally, with a free pass).

    Introduced in notebook 05 (speculative decoding)."""
    colors = [CURRENT if i == current else OTHER for i in range(len(labels))]
    fig = go.Figure(go.Bar(x=list(labels), y=list(measured), name="measured", marker_color=colors,
                           text=[f"{m:.2f}x" for m in measured]))
    fig.add_trace(go.Bar(x=list(labels), y=list(predicted), name="predicted (measured draft and verify costs)",
                         marker_color="#2ca02c", text=[f"{p:.2f}x" for p in predicted]))
    if predicted_free_pass is not None:
        fig.add_trace(go.Bar(x=list(labels), y=list(predicted_free_pass), name="predicted with a free verify pass",
                             marker_color="#c7e9c0", text=[f"{p:.2f}x" for p in predicted_free_pass]))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="plain decoding", annotation_position="right")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="speedup [x]", rangemode="tozero")
    return _layout(fig, "speedup over plain decoding", right=110)


def sampling_figure(labels: Sequence[str], target: Sequence[float], samples: Sequence[float],
                    draft: Sequence[float], n: int, from_target: Sequence[float] | None = None) -> go.Figure:
    """The sampling experiment: the target's exact probabilities, the frequencies of n
    speculative samples and the draft's probabilities, token by token; optionally what
    drawing the replacement from the target itself would give (computed exactly).

    Introduced in notebook 05 (speculative decoding)."""
    fig = go.Figure([go.Bar(x=list(labels), y=list(target), name="target p (exact)"),
                     go.Bar(x=list(labels), y=list(samples), name=f"speculative samples (N={n})"),
                     go.Bar(x=list(labels), y=list(draft), name="draft q (exact)")])
    if from_target is not None:
        fig.add_trace(go.Bar(x=list(labels), y=list(from_target), name="replacement drawn from p (exact)",
                             marker_color="#cccccc"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="probability", rangemode="tozero")
    return _layout(fig, "first token: speculative samples vs the target's exact probabilities", height=360)
