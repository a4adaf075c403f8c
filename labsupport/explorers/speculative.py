"""Notebook 05's explorer: draft, lookahead k and temperature, live.

Introduced in notebook 05 (speculative decoding).

Choosing a draft, k (tokens drafted per step) and a temperature runs
speculative decoding on the chosen prompt (small: a few dozen new tokens) and
redraws two figures for every setting measured so far: the acceptance rate and
tokens per target call, and the measured speedup over plain decoding beside the
one Leviathan et al.'s formula predicts from the measured acceptance and draft
cost. Results are cached, so going back to a setting shows at once.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from ..generation import chat_prompt, generate
from ..measure import time_side_by_side
from ..sampling import SamplingConfig
from ..speculative import expected_speedup, speculative_generate
from .base import Explorer

HEIGHT = 300
TEMPERATURES = (0.0, 0.7, 1.0)
_LABEL = {"description_width": "initial"}
_LEGEND = dict(orientation="h", yanchor="bottom", y=1.02, x=0)   # above the plot: full width for the bars


def _encode(tokenizer, text: str) -> list[int]:
    try:
        return tokenizer.encode(chat_prompt(tokenizer, text))
    except Exception:                                   # a tokenizer without a chat template
        return list(tokenizer.encode(text))


def speculative_explorer(target, tokenizer, drafts: dict, prompts: dict, new_tokens: int = 24,
                         repeats: int = 1, use_widget: bool | None = None) -> Explorer:
    """drafts: name -> Draft; prompts: name -> prompt text. Controls: prompt, draft, k, temperature.
    Notebook 05 (speculative decoding)."""
    encoded = {name: _encode(tokenizer, text) for name, text in prompts.items()}
    plain_cache: dict = {}
    results: dict = {}

    def plain_time(prompt_name, temperature):
        key = (prompt_name, temperature)
        if key not in plain_cache:
            sampling = SamplingConfig(temperature=temperature, seed=0)
            ids = encoded[prompt_name]
            fn = lambda: generate(target, ids, new_tokens, sampling=sampling, eos_token_ids=())  # noqa: E731
            plain_cache[key] = time_side_by_side({"plain": fn}, target.device, warmup=1,
                                                 repeats=repeats)["plain"].median
        return plain_cache[key]

    def measure(prompt_name, draft_name, k, temperature):
        key = (prompt_name, draft_name, k, temperature)
        if key in results:
            return results[key]
        sampling = SamplingConfig(temperature=temperature, seed=0)
        draft = drafts[draft_name]
        if hasattr(draft, "sampling"):
            draft.sampling = sampling                    # a model draft samples like the target
        ids = encoded[prompt_name]
        out = {}

        def fn():
            out["r"] = speculative_generate(target, draft, ids, new_tokens, k=k, sampling=sampling,
                                            eos_token_ids=())
        t = time_side_by_side({"spec": fn}, target.device, warmup=1, repeats=repeats)["spec"].median
        plain = plain_time(prompt_name, temperature)
        s = out["r"].stats
        plain_step = plain / new_tokens
        c = s.draft_seconds / max(s.drafted, 1) / plain_step
        alpha = min(max(s.alpha, 0.0), 1.0)
        results[key] = {"acceptance": s.acceptance_rate, "per_call": s.tokens_per_call,
                        "measured": plain / t, "predicted": expected_speedup(alpha, k, c)}
        return results[key]

    def label(key):
        prompt_name, draft_name, k, temperature = key
        return f"{draft_name}, k={k}, T={temperature}" + (f" ({prompt_name})" if len(prompts) > 1 else "")

    def render(values):
        current = (values["prompt"], values["draft"], int(values["k"]), float(values["temperature"]))
        measure(*current)
        keys = list(results)
        names = [label(key) for key in keys]
        colors = ["#d62728" if key == current else "#1f77b4" for key in keys]
        rates = go.Figure()
        rates.add_trace(go.Bar(x=names, y=[results[k]["acceptance"] for k in keys], name="acceptance rate",
                               marker_color=colors, text=[f"{results[k]['acceptance']:.2f}" for k in keys]))
        rates.add_trace(go.Bar(x=names, y=[results[k]["per_call"] for k in keys], name="tokens per target call",
                               marker_color="#ff7f0e", text=[f"{results[k]['per_call']:.2f}" for k in keys]))
        rates.update_layout(barmode="group", height=HEIGHT, title="acceptance rate and tokens per target call",
                            yaxis_title="rate [0-1] / tokens per call", template="plotly_white",
                            legend=_LEGEND, margin=dict(t=70, b=40, l=60, r=110))
        speed = go.Figure()
        speed.add_trace(go.Bar(x=names, y=[results[k]["measured"] for k in keys], name="measured speedup",
                               marker_color=colors, text=[f"{results[k]['measured']:.2f}x" for k in keys]))
        speed.add_trace(go.Bar(x=names, y=[results[k]["predicted"] for k in keys],
                               name="predicted (Leviathan et al., measured draft cost)", marker_color="#2ca02c",
                               text=[f"{results[k]['predicted']:.2f}x" for k in keys]))
        # The line's label right of the plot: inside, it ran into the bars.
        speed.add_hline(y=1.0, line_dash="dot", annotation_text="plain decoding", annotation_position="right")
        speed.update_layout(barmode="group", height=HEIGHT, title="speedup over plain decoding",
                            yaxis_title="speedup [x]", template="plotly_white", legend=_LEGEND,
                            margin=dict(t=70, b=40, l=60, r=110))
        return [rates, speed]

    controls = {
        # description_width "initial": the default width cut "temperature" to "temperat...".
        "prompt": widgets.Dropdown(options=list(prompts), description="prompt", style=_LABEL),
        "draft": widgets.Dropdown(options=list(drafts), description="draft", style=_LABEL),
        "k": widgets.IntSlider(value=4, min=1, max=8, description="k", continuous_update=False, style=_LABEL),
        "temperature": widgets.Dropdown(options=list(TEMPERATURES), value=0.0, description="temperature",
                                        style=_LABEL, layout=widgets.Layout(width="200px")),
    }
    return Explorer(controls, render, title="Speculative decoding: draft, lookahead k, temperature",
                    use_widget=use_widget)
