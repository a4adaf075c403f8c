"""Notebook 04's explorer: bits, group size and method, live.

Introduced in notebook 04 (quantization).

Choosing the bits (8 or 4), the group size (used for 4 bits) and the method
(the package's own int8/int4, or bitsandbytes' LLM.int8() / NF4) redraws four
figures: the error histogram of one real weight matrix, and, for every setting
measured so far, the weights' memory, the decode speed relative to fp32 and the
perplexity on the shipped evaluation text. A setting is measured the first time
it is chosen (small: a few new tokens, a short text) and cached, so going back
to it shows at once.
"""

from __future__ import annotations

from statistics import median

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import torch

from ..errors import LabError
from ..generation import generate
from ..measure import time_side_by_side
from ..quantize import perplexity, quantize_model, quantized_bytes, weight_error_stats
from .base import Explorer

MIB = 2**20
HEIGHT = 300
_LABEL = {"description_width": "initial"}


def setting_label(bits: int, group_size: int, method: str) -> str:
    """A short name for one setting, e.g. 'int4 g32' or 'bnb nf4'. Notebook 04 (quantization)."""
    if method == "bitsandbytes":
        return "bnb int8" if bits == 8 else "bnb nf4"
    return "int8" if bits == 8 else f"int4 g{group_size}"


def method_name(bits: int, group_size: int, method: str) -> tuple[str, int]:
    """(quantize_model method, group size) for one setting. Notebook 04 (quantization)."""
    if method == "bitsandbytes":
        return ("bnb-int8" if bits == 8 else "bnb-nf4"), group_size
    return ("int8" if bits == 8 else "int4"), group_size


def error_histogram_figure(errors: dict[str, np.ndarray], title: str = "") -> go.Figure:
    """Histograms of quantization errors (dequantized - original), one trace per setting.
    Notebook 04 (quantization)."""
    fig = go.Figure()
    for name, values in errors.items():
        fig.add_trace(go.Histogram(x=np.asarray(values).ravel(), name=name, nbinsx=80, opacity=0.6))
    fig.update_layout(barmode="overlay", height=HEIGHT, title=title, margin=dict(t=40, b=40, l=60, r=20),
                      template="plotly_white",
                      xaxis_title="error of one weight (dequantized - original)", yaxis_title="number of weights")
    return fig


def bar_figure(values: dict[str, float | None], title: str, y_title: str, highlight: str | None = None,
               reference: float | None = None, fmt: str = "{:.2f}") -> go.Figure:
    """One bar per setting (None: not measured, left out), the current one highlighted.
    Notebook 04 (quantization)."""
    names = [n for n, v in values.items() if v is not None]
    ys = [values[n] for n in names]
    colors = ["#d62728" if n == highlight else "#1f77b4" for n in names]
    fig = go.Figure(go.Bar(x=names, y=ys, marker_color=colors, text=[fmt.format(v) for v in ys],
                           textposition="outside"))
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dot", line_color="gray")
    fig.update_layout(height=HEIGHT, title=title, yaxis_title=y_title, margin=dict(t=40, b=40, l=60, r=20),
                      template="plotly_white")
    return fig


def _default_weight(model) -> str:
    names = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not names:
        raise LabError("quantize_explorer needs a model with nn.Linear layers.")
    return next((n for n in names if n.endswith("mlp.down")), names[0])


class QuantizeLab:
    """The measurements behind the explorer, each taken once and cached.

    Introduced in notebook 04 (quantization). `results[label]` holds memory (MiB of
    weights a decode step reads), speedup (decode tokens/s relative to fp32, timed
    side by side) and perplexity; `errors[label]` the error tensor of one weight matrix.
    """

    def __init__(self, model, tokenizer, prompt: str = "The quick brown fox", new_tokens: int = 8,
                 eval_tokens: int = 128, repeats: int = 2, weight_name: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.prompt_ids = tokenizer.encode(prompt)
        self.new_tokens, self.eval_tokens, self.repeats = new_tokens, eval_tokens, repeats
        self.weight_name = weight_name or _default_weight(model)
        self.weight = model.get_submodule(self.weight_name).weight.detach().float()
        self.results: dict[str, dict] = {"fp32": {"memory": model.weight_bytes() / MIB, "speedup": 1.0,
                                                  "perplexity": None}}
        self.errors: dict[str, np.ndarray] = {}

    def error(self, bits: int, group_size: int, method: str) -> np.ndarray:
        """Errors of the chosen weight matrix (bitsandbytes' LLM.int8() stores weights as
        per-row absmax int8 like ours, so its histogram is ours)."""
        label = setting_label(bits, group_size, method)
        if label not in self.errors:
            w = self.weight
            kind = {"bnb nf4": "bnb-nf4", "bnb int8": "int8"}.get(label, "int8" if bits == 8 else "int4")
            if kind == "int4" and w.shape[1] % group_size:
                w = w[:, : w.shape[1] // group_size * group_size]         # whole groups only
            self.errors[label] = weight_error_stats(w, kind, group_size)["error"].numpy()
        return self.errors[label]

    def _decode(self, handle, store: list):
        def run():
            if handle is None:
                result = generate(self.model, self.prompt_ids, self.new_tokens, eos_token_ids=())
            else:
                with handle:
                    result = generate(self.model, self.prompt_ids, self.new_tokens, eos_token_ids=())
            store.append(result.decode_seconds)
        return run

    def measure(self, bits: int, group_size: int, method: str) -> dict:
        """Memory, decode speed relative to fp32, and perplexity of one setting (cached)."""
        label = setting_label(bits, group_size, method)
        if self.results["fp32"]["perplexity"] is None:
            self.results["fp32"]["perplexity"] = perplexity(self.model, self.tokenizer, max_tokens=self.eval_tokens)
        if label in self.results:
            return self.results[label]
        name, group = method_name(bits, group_size, method)
        handle = quantize_model(self.model, name, group_size=group)
        try:
            memory = quantized_bytes(self.model) / MIB
            ppl = perplexity(self.model, self.tokenizer, max_tokens=self.eval_tokens)
        finally:
            handle.restore()
        base, quantized = [], []
        time_side_by_side({"fp32": self._decode(None, base), label: self._decode(handle, quantized)},
                          self.model.device, warmup=1, repeats=self.repeats)
        self.results[label] = {"memory": memory, "speedup": median(base) / median(quantized), "perplexity": ppl}
        return self.results[label]


def quantize_explorer(model, tokenizer, prompt: str = "The quick brown fox", new_tokens: int = 8,
                      eval_tokens: int = 128, repeats: int = 2, weight_name: str | None = None,
                      use_widget: bool | None = None) -> Explorer:
    """Controls: bits (8/4), group size (32/64/128, for 4 bits), method (own / bitsandbytes);
    figures: error histogram of one weight matrix, memory, decode speed vs fp32, perplexity.

    Introduced in notebook 04 (quantization). model: a float32 model (quantized in place
    while a setting is measured, then restored); tokenizer: its tokenizer. new_tokens,
    eval_tokens and repeats size each measurement (small, so a CPU answers in seconds);
    weight_name: the nn.Linear whose errors are drawn (default: the first MLP down projection).
    Also accepts a `QuantizeLab` as `model` (then the other sizes are ignored).
    """
    lab = model if isinstance(model, QuantizeLab) else QuantizeLab(
        model, tokenizer, prompt, new_tokens, eval_tokens, repeats, weight_name)
    controls = {
        # description_width "initial": the default width cut "group (4 bits)" to "group (4 ...".
        "bits": widgets.Dropdown(options=[8, 4], value=8, description="bits", style=_LABEL,
                                 layout=widgets.Layout(width="120px")),
        "group_size": widgets.Dropdown(options=[32, 64, 128], value=32, description="group (4 bits)",
                                       style=_LABEL, layout=widgets.Layout(width="200px")),
        "method": widgets.Dropdown(options=[("own (labsupport)", "own"), ("bitsandbytes", "bitsandbytes")],
                                   value="own", description="method", style=_LABEL,
                                   layout=widgets.Layout(width="260px")),
    }

    def render(values: dict):
        bits, group, method = values["bits"], values["group_size"], values["method"]
        label = setting_label(bits, group, method)
        lab.measure(bits, group, method)
        errors = lab.error(bits, group, method)
        results = lab.results
        return [
            error_histogram_figure({label: errors}, f"{label}: errors of {lab.weight_name} "
                                                    f"{tuple(lab.weight.shape)}, max |error| {np.abs(errors).max():.2g}"),
            bar_figure({n: r["memory"] for n, r in results.items()}, "weights read per decode step",
                       "weights read [MiB]", label, fmt="{:.0f}"),
            bar_figure({n: r["speedup"] for n, r in results.items()},
                       f"decode speed vs fp32 ({lab.new_tokens} new tokens, batch 1)",
                       "speed relative to fp32 [x]", label, 1.0),
            bar_figure({n: r["perplexity"] for n, r in results.items()},
                       f"perplexity on {lab.eval_tokens} tokens of the evaluation text (lower is better)",
                       "perplexity", label, results["fp32"]["perplexity"]),
        ]

    return Explorer(controls, render, title="Quantized weights: error, memory, speed and quality",
                    use_widget=use_widget)
