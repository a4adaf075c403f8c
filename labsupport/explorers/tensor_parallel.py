"""Notebook 10's explorer: a tensor-parallel step's compute against its all-reduces, by degree,
tokens per step and link.

Introduced in notebook 10 (past one device).

The model of one forward pass at degree d is two terms. Compute: this machine's measured TP=1
time for the step's tokens (`compute_seconds`: the decode step for one token, plus the prefill's
cost per token for more), divided by d, as if the split were perfect. Communication: two
all-reduces per layer, each a latency plus a ring's 2 (d - 1) / d of the message over the link's
bandwidth (`all_reduce_seconds`). The links are data-sheet figures, and this machine's own gloo
link as measured. Nothing is run while the controls move: the figures are arithmetic.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from ..lab.tensor_parallel import LINKS
from .base import Explorer

DEGREES = (1, 2, 4, 8)
TOKENS = (1, 8, 64, 512, 2048)


def all_reduce_seconds(layers: int, hidden: int, tokens: int, world: int, gb_per_s: float, latency_us: float,
                       bytes_per_value: int = 4) -> float:
    """Seconds one forward pass spends in its 2 x layers all-reduces of (tokens, hidden) values
    over a ring of `world` ranks. Notebook 10 (past one device)."""
    if world == 1:
        return 0.0
    message = tokens * hidden * bytes_per_value
    return 2 * layers * (latency_us * 1e-6 + 2 * (world - 1) / world * message / (gb_per_s * 1e9))


def measured_link(result: dict, world: int = 2) -> dict:
    """This machine's gloo link, from `measure_tensor_parallel`'s all-reduce probes: the latency
    of a one-row message, and the bandwidth the prefill-sized message added over it.
    Notebook 10 (past one device)."""
    probe = result["degrees"][world]["all_reduce_latency"]
    small, large = probe["decode_row"], probe["prefill"]
    extra = max(large["median_s"] - small["median_s"], 1e-9)
    moved = 2 * (world - 1) / world * (large["bytes"] - small["bytes"])
    return {"gb_per_s": moved / extra / 1e9, "latency_us": small["median_s"] * 1e6}


def compute_seconds(result: dict, tokens: int) -> float:
    """This machine's TP=1 compute for a forward pass of `tokens` tokens: the measured decode step,
    plus the prefill's measured cost per token for every further token. Notebook 10."""
    base = result["degrees"][min(result["degrees"])]
    step = 1 / base["decode_tokens_per_s"]
    per_token = base["prefill_s"] / result["prefill_tokens"]
    return step + (tokens - 1) * per_token


def tensor_parallel_explorer(result: dict, config, use_widget: bool | None = None) -> Explorer:
    """Controls: tokens per forward pass, the link, the degree to read off. The figure: compute
    and communication per degree. Notebook 10 (past one device). result:
    `lab.tensor_parallel.measure_tensor_parallel`'s, with TP=2 among its degrees."""
    links = {"this machine (gloo, measured)": measured_link(result), **LINKS}

    def render(values):
        tokens, link, chosen = values["tokens"], links[values["link"]], values["degree"]
        compute = [compute_seconds(result, tokens) / d for d in DEGREES]
        talk = [all_reduce_seconds(config.num_layers, config.hidden_size, tokens, d, **link) for d in DEGREES]
        labels = [f"TP={d}" for d in DEGREES]
        total = {d: c + t for d, c, t in zip(DEGREES, compute, talk)}
        fig = go.Figure([
            go.Bar(x=labels, y=[c * 1e3 for c in compute], name="compute (measured TP=1, split perfectly)",
                   marker_color="#2ca02c"),
            go.Bar(x=labels, y=[t * 1e3 for t in talk], name="all-reduces (2 per layer)", marker_color="#d62728",
                   text=[f"{t / (c + t):.0%}" if t else "" for c, t in zip(compute, talk)], textposition="outside")])
        fig.update_layout(
            barmode="stack", height=380, yaxis_title="ms per forward pass", margin=dict(l=10, r=10, t=80, b=40),
            title=(f"{tokens} token(s) per pass over {values['link']}: TP={chosen} takes "
                   f"{total[chosen] * 1e3:.2f} ms, {total[1] / total[chosen]:.2f}x TP=1's speed<br><sup>"
                   f"link: {link['gb_per_s']:.3g} GB/s, {link['latency_us']:.3g} us per all-reduce</sup>"))
        return [fig]

    controls = {
        "tokens": widgets.Dropdown(options=list(TOKENS), value=1, description="tokens/pass"),
        "link": widgets.Dropdown(options=list(links), value=next(iter(links)), description="link"),
        "degree": widgets.ToggleButtons(options=list(DEGREES), value=2, description="read off"),
    }
    return Explorer(controls, render, title="Tensor parallelism: compute against communication",
                    use_widget=use_widget)
