"""Notebook 05's explorer: draft, lookahead k and temperature, live.

Introduced in notebook 05 (speculative decoding).

Choosing a draft, k (tokens drafted per step) and a temperature runs
speculative decoding on the chosen prompt (small: a few dozen new tokens) and
redraws two figures for every setting measured so far: the acceptance rate and
the tokens per target pass (two panels: a fraction and a count), and the measured
speedup over plain decoding beside the one Leviathan et al.'s formula predicts from
the measured acceptance, draft cost and verify-pass cost (and, lighter, with a free
verify pass, as the formula assumes). Results are cached, so going back to a setting
shows at once.
"""

from __future__ import annotations

import ipywidgets as widgets

from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..lab.measure import require_graphed, time_side_by_side, timed_compile
from ..plots.speculative import acceptance_figure, speedup_figure
from ..engine.sampling import SamplingConfig
from ..lab.speculative_math import expected_speedup, pass_costs
from ..engine.speculative import speculative_generate
from .base import Explorer

TEMPERATURES = (0.0, 0.7, 1.0)
_LABEL = {"description_width": "initial"}


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
    graphed = timed_compile(target.device)       # on a GPU both sides replay CUDA graphs (notebook 00)
    plain_cache: dict = {}
    results: dict = {}

    def plain_time(prompt_name, temperature):
        """(median seconds of a plain generation, seconds of one of its decode steps)."""
        key = (prompt_name, temperature)
        if key not in plain_cache:
            sampling = SamplingConfig(temperature=temperature, seed=0)
            ids, out = encoded[prompt_name], {}

            def fn():
                out["r"] = require_graphed(generate(target, ids, new_tokens, sampling=sampling, eos_token_ids=(),
                                                    compile=graphed), "plain generate", target.device)
            median = time_side_by_side({"plain": fn}, target.device, warmup=1, repeats=repeats)["plain"].median
            plain_cache[key] = median, out["r"].decode_seconds / max(new_tokens - 1, 1)
        return plain_cache[key]

    def measure(prompt_name, draft_name, k, temperature):
        key = (prompt_name, draft_name, k, temperature)
        if key in results:
            return results[key]
        sampling = SamplingConfig(temperature=temperature, seed=0)
        draft = drafts[draft_name]
        ids = encoded[prompt_name]
        out = {}

        def fn():
            out["r"] = require_graphed(speculative_generate(target, draft, ids, new_tokens, k=k, sampling=sampling,
                                                            eos_token_ids=(), compile=graphed),
                                       f"speculative decoding with the {draft_name} draft", target.device)
        t = time_side_by_side({"spec": fn}, target.device, warmup=1, repeats=repeats)["spec"].median
        plain, plain_step = plain_time(prompt_name, temperature)
        s = out["r"].stats
        costs = pass_costs(s, plain_step)
        alpha = min(max(s.alpha, 0.0), 1.0) if s.accepted + s.rejected else 0.0
        results[key] = {"acceptance": s.acceptance_rate if s.drafted else 0.0, "per_call": s.tokens_per_call,
                        "measured": plain / t,
                        "predicted": expected_speedup(alpha, k, costs.draft_per_token, costs.verify_per_pass),
                        "predicted_free": expected_speedup(alpha, k, costs.draft_per_token)}
        return results[key]

    def label(key):
        prompt_name, draft_name, k, temperature = key
        return f"{draft_name}, k={k}, T={temperature}" + (f" ({prompt_name})" if len(prompts) > 1 else "")

    def render(values):
        current = (values["prompt"], values["draft"], int(values["k"]), float(values["temperature"]))
        measure(*current)
        keys = list(results)
        names, now = [label(key) for key in keys], keys.index(current)
        column = lambda field: [results[key][field] for key in keys]                   # noqa: E731
        return [acceptance_figure(names, column("acceptance"), column("per_call"), current=now),
                speedup_figure(names, column("measured"), column("predicted"), column("predicted_free"),
                               current=now)]

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
