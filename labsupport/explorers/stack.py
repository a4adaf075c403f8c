"""Notebook 07's explorer: switch each technique on or off and serve the same requests.

Introduced in notebook 07 (putting it together).

The switches are the course's techniques (KV cache, batching policy, precision,
weight format, speculative decoding). Each Run serves a small workload with the
chosen combination and with plain cached fp32 decoding, side by side, and adds
the combination to a bar chart of every one tried so far: its speedup, and its
teacher-forced top-1 agreement with fp32 on evaluation tokens (as notebook 04
measures quality; without evaluation tokens, the fraction of generated tokens
equal to fp32's, which drifts apart after the first changed token). Combinations
the engine cannot run (for example speculative decoding together with batching)
say why in one sentence.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..lab.measure import time_side_by_side
from ..lab.quality import top1_agreement
from ..lab.stack import BATCHING, low_precision, serve_fn
from ..lab.variants import ModelVariants
from .base import Explorer


def stack_explorer(model, requests, slots: int = 4, variants: ModelVariants | None = None,
                   repeats: int = 1, agreement_tokens=None, use_widget: bool | None = None) -> Explorer:
    """Controls: KV cache, batching, precision, weights, speculative; a Run button.
    Notebook 07 (putting it together). agreement_tokens: token ids for the quality bar
    (`quality.top1_agreement` against `model`); None: generated tokens compared instead."""
    variants = variants or ModelVariants(model)
    dtype, half = low_precision(model.device)
    precisions = ["fp32"] + ([half] if dtype is not None else [])
    tokens = sum(r.max_new_tokens for r in requests)
    results: dict = {}
    reference: dict = {}
    agreement: dict = {}
    if agreement_tokens is not None:
        quality_title, quality_axis = "agreement with fp32", "top-1, teacher-forced [%]"
    else:
        quality_title, quality_axis = "same tokens as fp32", "generated tokens [%]"

    def label(v):
        parts = ["cache" if v["kv_cache"] else "no cache", f"batching {v['batching']}", v["precision"]]
        parts += [] if v["weights"] == "float" else [v["weights"]]
        parts += ["speculative"] if v["speculative"] else []
        return ", ".join(parts)

    def render(values):
        name = label(values)
        if name not in results:
            fn = serve_fn(variants, requests, slots=slots, **values)
            plain = serve_fn(variants, requests, slots=slots)
            out = {}
            timings = time_side_by_side({"this": lambda: out.__setitem__("this", fn()),
                                         "plain": lambda: out.__setitem__("plain", plain())},
                                        model.device, warmup=0, repeats=repeats)
            reference.update(out["plain"])
            same = sum(a == b for r in requests
                       for a, b in zip(out["this"][r.request_id], out["plain"][r.request_id]))
            quality = same / tokens
            if agreement_tokens is not None:
                key = (values["precision"], values["weights"])
                if key not in agreement:                 # one teacher-forced pass per model variant
                    served = variants.get(*key)
                    agreement[key] = 1.0 if served is model else top1_agreement(model, served, agreement_tokens)
                quality = agreement[key]
            results[name] = {"speedup": timings["plain"].median / timings["this"].median,
                             "tokens_per_s": tokens / timings["this"].median, "same": quality}
        names = list(results)
        colors = ["#d62728" if n == name else "#1f77b4" for n in names]
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, column_widths=[0.62, 0.38],
                            shared_yaxes=True,
                            subplot_titles=("speedup", quality_title))
        fig.add_trace(go.Bar(y=names, x=[results[n]["speedup"] for n in names], orientation="h",
                             marker_color=colors, text=[f"{results[n]['speedup']:.2f}x" for n in names],
                             hovertext=[f"{results[n]['tokens_per_s']:.1f} tokens/s" for n in names],
                             showlegend=False), row=1, col=1)
        fig.add_trace(go.Bar(y=names, x=[100 * results[n]["same"] for n in names], orientation="h",
                             marker_color=colors, text=[f"{results[n]['same']:.0%}" for n in names],
                             showlegend=False), row=1, col=2)
        fig.add_vline(x=1.0, line_dash="dot", row=1, col=1)
        fig.update_xaxes(title_text="over plain cached fp32 [x]", row=1, col=1)
        fig.update_xaxes(title_text=quality_axis, range=[0, 105], row=1, col=2)
        fig.update_yaxes(automargin=True, autorange="reversed")
        fig.update_layout(height=max(260, 70 + 40 * len(names)), margin=dict(t=50, b=50, l=10, r=20),
                          title=f"{len(requests)} requests, {tokens} tokens (red: the setting just run)")
        return [fig]

    controls = {
        "kv_cache": widgets.Checkbox(value=True, description="KV cache"),
        "batching": widgets.Dropdown(options=list(BATCHING), value="continuous", description="batching"),
        "precision": widgets.Dropdown(options=precisions, value=precisions[-1], description="precision"),
        "weights": widgets.Dropdown(options=["float", "int8", "int4"], value="int4", description="weights"),
        "speculative": widgets.Checkbox(value=False, description="speculative (prompt lookup)"),
    }
    return Explorer(controls, render, title="The whole stack: switch techniques on and off, then Run",
                    run_button=True, use_widget=use_widget)
