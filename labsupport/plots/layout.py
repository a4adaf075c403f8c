"""Where a figure's legend goes so that it never sits on a title, an axis title or a tick label.

Introduced in notebook 00 (where the time goes); used by every notebook's figures. A legend
above the plot (plotly's y=1.02 in paper units) climbs into the title as soon as its entries
wrap onto a second line, which they do at a laptop's width; one below the plot in paper units
lands on the axis titles of a short figure. So the legend goes in the bottom margin, placed
from the bottom of the whole figure (yref "container"), one entry per line, and the margin is
made tall enough for it: nothing else is ever drawn there. tests/figure_layout.py checks the
result in a real browser at 700 and 960 px.

The house colours live here too: `PHASE_COLORS`, one colour for prefill and one for decode, the
same in every figure that draws the two phases (notebooks 00, 06, 06b and 10).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

LINE_PX = 26         # one legend entry and the gap after it, at plotly's default font (measured: 29 apart)
AXIS_PX = 62         # below the plot: the tick labels and the axis title

# Prefill orange, decode blue: in the phase timeline (06, 06b), per tensor-parallel degree and in the
# handover (10), and the engines figure (00). The other figures of 06-10 leave both colours free.
# tests/test_colour_code.py checks every such figure.
PHASE_COLORS = {"prefill": "#ff7f0e", "decode": "#1f77b4"}


def legend_below(fig: go.Figure, extra_px: int = 0) -> go.Figure:
    """Put `fig`'s legend under its plots, one entry per line, and size the bottom margin for it.

    Notebook 00 (where the time goes). extra_px: more room between the plots and the legend
    (tick labels of two lines, say). Returns the figure."""
    entries = sum(1 for trace in fig.data if trace.showlegend is not False and trace.name)
    fig.update_layout(legend=dict(orientation="v", yref="container", yanchor="bottom", y=0, xanchor="left", x=0,
                                  bgcolor="rgba(0,0,0,0)"),
                      margin=dict(b=AXIS_PX + extra_px + LINE_PX * entries + 8))
    return fig


def title_lines(fig: go.Figure, title: str, subtitle_size: int = 12) -> int:
    """Set `fig`'s title from "line<br>more lines": the first line at the title's size, the rest
    smaller, all in one title (plotly's own `title.subtitle` lands above the title in some
    front ends' plotly.js). Returns the smaller lines' count: the caller makes the top margin
    tall enough (plotly centres the title in it). Notebook 00 (where the time goes)."""
    head, _, rest = title.partition("<br>")
    rest = rest.replace("<sup>", "").replace("</sup>", "")
    lines = rest.split("<br>") if rest else []
    small = "".join(f"<br><span style='font-size:{subtitle_size}px'>{line}</span>" for line in lines)
    fig.update_layout(title=dict(text=head + small))
    return len(lines)


def log_ticks(values) -> dict:
    """Tick values and labels of a log axis holding `values` (all > 0): 1, 2 and 5 of each decade
    in range, or every decade where those would crowd (more than 8), each labelled in full
    (plotly's own labels a short range's every digit, and a minor tick with its digit only).
    Notebook 00 (where the time goes); pass as `fig.update_xaxes(type="log", **log_ticks(values))`."""
    values = [v for v in values if v and v > 0]
    if not values:
        return {}
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    steps = [m * 10.0 ** e for e in range(low, high + 1) for m in (1, 2, 5)]
    shown = [t for t in steps if min(values) / 1.5 <= t <= max(values) * 1.5]
    if len(shown) > 8:
        shown = [10.0 ** e for e in range(low, high + 1)]
    return dict(tickvals=shown, ticktext=[f"{t:g}" for t in shown])
