"""Notebook 04's explorer: bits, group size and method, live.

Introduced in notebook 04 (quantization).

Choosing the bits (8 or 4), the group size (used for 4 bits) and the method
(the package's own int8/int4, or bitsandbytes' LLM.int8() / NF4) redraws four
figures: the error histogram of one real weight matrix, and, for every setting
measured so far, the weights' memory (resident, and read per decode step), the
decode speed relative to fp32 and to bf16 (the fast int8/int4 kernels compute in
bf16, so the ratio to bf16 is the weights' own share), with the kernel that ran,
and the perplexity on the shipped evaluation text. A setting is measured the first
time it is chosen (small: a few new tokens, a short text) and cached, so going back
to it shows at once. `packing_figure` draws how int4 stores one group.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import torch

from ..lab.busy import BUSY_VERDICT, busy_reason, load_per_core
from ..errors import LabError
from ..engine.generation import generate
from ..lab.measure import Timing, require_graphed, time_side_by_side, timed_compile
from ..engine.precision import cast_model
from ..lab.precision import precision_choices
from ..engine.quant import pack_int4, quantize_int4_groupwise, quantize_model
from ..lab.quantization_error import weight_error_stats
from ..lab.quality import perplexity, quantized_bytes, resident_bytes
from .base import Explorer
from ..plots.layout import title_lines

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


def grouped_bar_figure(series: dict[str, dict[str, float | None]], title: str, y_title: str,
                       highlight: str | None = None, reference: float | None = None,
                       fmt: str = "{:.2f}") -> go.Figure:
    """Bars of several series side by side per setting ({series: {setting: value}}), None left out;
    the current setting's bars outlined. Notebook 04 (quantization)."""
    fig = go.Figure()
    for color, (series_name, values) in zip(("#1f77b4", "#ff7f0e", "#2ca02c"), series.items()):
        names = [n for n, v in values.items() if v is not None]
        ys = [values[n] for n in names]
        fig.add_trace(go.Bar(x=names, y=ys, name=series_name, text=[fmt.format(v) for v in ys],
                             textposition="outside", marker=dict(color=color, line=dict(
                                 color="black", width=[3 if n == highlight else 0 for n in names]))))
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dot", line_color="gray")
    fig.update_layout(height=HEIGHT, title=title, yaxis_title=y_title, barmode="group", template="plotly_white",
                      margin=dict(t=80, b=40, l=60, r=20), legend=dict(orientation="h", y=1.02, x=1, xanchor="right",
                                                                       yanchor="bottom"))
    return fig


def packing_figure(group: torch.Tensor, shown: int = 8) -> go.Figure:
    """How int4 stores one group of weights: the float weights, their 4-bit integers
    q = round((w - zero) / scale) with the group's scale and zero, and the bytes that hold
    two of them each (column 2j in the low nibble, 2j + 1 in the high one).

    Introduced in notebook 04 (quantization). group: one group of a weight row (1-D,
    even length); the first `shown` values (even) are drawn.
    """
    group = torch.as_tensor(group, dtype=torch.float32).flatten()
    shown = min(shown, group.numel()) // 2 * 2
    q, scales, zeros = quantize_int4_groupwise(group.reshape(1, -1), group.numel())   # one group: (1, g)
    packed = pack_int4(q[:, :shown])[0]                                                  # (shown / 2,)
    colors = {0: "#1f77b4", 1: "#ff7f0e"}                                                # even / odd column
    fig = go.Figure()

    def box(x0: float, y0: float, width: float, text: str, fill: str) -> None:
        fig.add_shape(type="rect", x0=x0, x1=x0 + width, y0=y0, y1=y0 + 0.8, fillcolor=fill, opacity=0.25,
                      line=dict(color="white", width=2))
        fig.add_annotation(x=x0 + width / 2, y=y0 + 0.4, text=text, showarrow=False, font=dict(size=12))

    for i in range(shown):
        box(i, 2, 1, f"{group[i]:+.4f}", "#7f7f7f")
        box(i, 1, 1, f"<b>{int(q[0, i])}</b><br>{int(q[0, i]):04b}", colors[i % 2])
    for j, byte in enumerate(packed.tolist()):
        high, low = byte >> 4, byte & 0x0F
        box(2 * j, 0, 2, f"<span style='color:{colors[1]}'>{high:04b}</span>"
                         f"<span style='color:{colors[0]}'>{low:04b}</span> = {byte}", "#2ca02c")
    for y, label in ((2.4, "weights (fp32)"), (1.4, "4-bit integers q"), (0.4, "bytes: high | low nibble")):
        fig.add_annotation(x=-0.15, y=y, text=label, showarrow=False, xanchor="right", font=dict(size=12))
    fig.update_xaxes(visible=False, range=[-3.2, shown + 0.1])
    fig.update_yaxes(visible=False, range=[-0.1, 2.9])
    title_lines(fig, f"One group of {group.numel()} weights (the first {shown} drawn)<br>scale "
                     f"{scales.item():.3g}, zero {zeros.item():+.4f}; w ≈ q × scale + zero; byte = q[2j] + 16 × q[2j+1]")
    fig.update_layout(height=280, template="plotly_white", margin=dict(t=80, b=10, l=10, r=10))
    return fig


def _default_weight(model) -> str:
    names = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not names:
        raise LabError("quantize_explorer needs a model with nn.Linear layers.")
    return next((n for n in names if n.endswith("mlp.down")), names[0])


class QuantizeLab:
    """The measurements behind the explorer, each taken once and cached.

    Introduced in notebook 04 (quantization). `results[label]` holds memory (MiB of
    weights a decode step reads), resident (MiB the model holds), speedup (decode
    tokens/s relative to fp32) and speedup_bf16 (relative to a bf16 copy, where bf16 runs
    here), each timed side by side, the kernel that ran (in words), busy (why the machine
    looked busy while it was timed, or None) and perplexity; `errors[label]` the error
    tensor of one weight matrix.
    """

    def __init__(self, model, tokenizer, prompt: str = "The quick brown fox", new_tokens: int = 8,
                 eval_tokens: int = 128, repeats: int = 2, weight_name: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.prompt_ids = tokenizer.encode(prompt)
        self.new_tokens, self.eval_tokens, self.repeats = new_tokens, eval_tokens, repeats
        self.weight_name = weight_name or _default_weight(model)
        self.weight = model.get_submodule(self.weight_name).weight.detach().float()
        self.results: dict[str, dict] = {"fp32": {"memory": quantized_bytes(model) / MIB,
                                                  "resident": resident_bytes(model) / MIB, "speedup": 1.0,
                                                  "speedup_bf16": None, "kernel": "dense matmul (fp32)",
                                                  "busy": None, "perplexity": None}}
        self.errors: dict[str, np.ndarray] = {}
        self._bf16 = None

    def bf16_model(self):
        """A bf16 copy of the model (cast on first use), or None where bf16 does not run here."""
        if self._bf16 is None and "bfloat16" in precision_choices(self.model.device):
            self._bf16 = cast_model(self.model, "bfloat16")
        return self._bf16

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

    def _decode(self, model, handle, store: list):
        graphed = timed_compile(model.device)        # on a GPU every setting replays a CUDA graph (notebook 00)

        def once():
            result = generate(model, self.prompt_ids, self.new_tokens, eos_token_ids=(), compile=graphed)
            return require_graphed(result, "the quantized decode" if handle is not None else "the float decode", model.device)

        def run():
            if handle is None:
                result = once()
            else:
                with handle:
                    result = once()
            store.append(result.decode_seconds)
        return run

    def measure(self, bits: int, group_size: int, method: str) -> dict:
        """Memory, decode speed relative to fp32 and bf16, kernel and perplexity of one setting (cached)."""
        label = setting_label(bits, group_size, method)
        if self.results["fp32"]["perplexity"] is None:
            self.results["fp32"]["perplexity"] = perplexity(self.model, self.tokenizer, max_tokens=self.eval_tokens)
        if label in self.results:
            return self.results[label]
        name, group = method_name(bits, group_size, method)
        handle = quantize_model(self.model, name, group_size=group)
        try:
            memory, resident = quantized_bytes(self.model) / MIB, resident_bytes(self.model) / MIB
            ppl = perplexity(self.model, self.tokenizer, max_tokens=self.eval_tokens)
        finally:
            handle.restore()
        samples: dict[str, list[float]] = {"fp32": [], label: []}
        runs = {"fp32": self._decode(self.model, None, samples["fp32"]),
                label: self._decode(self.model, handle, samples[label])}
        if self.bf16_model() is not None:
            samples["bf16"] = []
            runs["bf16"] = self._decode(self.bf16_model(), None, samples["bf16"])
        time_side_by_side(runs, self.model.device, warmup=1, repeats=self.repeats)
        timings = {n: Timing(v[-self.repeats:]) for n, v in samples.items()}          # the timed runs
        step = timings[label].median
        self.results[label] = {
            "memory": memory, "resident": resident, "speedup": timings["fp32"].median / step,
            "speedup_bf16": timings["bf16"].median / step if "bf16" in timings else None,
            "kernel": handle.describe(), "busy": busy_reason(timings, load=load_per_core()), "perplexity": ppl}
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
        current = lab.measure(bits, group, method)
        errors = lab.error(bits, group, method)
        results = lab.results
        busy = f"<br>{BUSY_VERDICT} ({current['busy']})" if current["busy"] else ""   # beside the figure
        return [
            error_histogram_figure({label: errors}, f"{label}: errors of {lab.weight_name} "
                                                    f"{tuple(lab.weight.shape)}, max |error| {np.abs(errors).max():.2g}"),
            grouped_bar_figure({"resident": {n: r["resident"] for n, r in results.items()},
                                "read per decode step": {n: r["memory"] for n, r in results.items()}},
                               "weights in memory, and read per decode step", "MiB", label, fmt="{:.0f}"),
            grouped_bar_figure({"vs fp32": {n: r["speedup"] for n, r in results.items()},
                                "vs bf16": {n: r["speedup_bf16"] for n, r in results.items()}},
                               f"decode speed ({lab.new_tokens} new tokens, batch 1)<br><sup>{label} ran the "
                               f"{current['kernel']}{busy}</sup>", "speed ratio [x]", label, 1.0),
            bar_figure({n: r["perplexity"] for n, r in results.items()},
                       f"perplexity on {lab.eval_tokens} tokens of the evaluation text (lower is better)",
                       "perplexity", label, results["fp32"]["perplexity"]),
        ]

    return Explorer(controls, render, title="Quantized weights: error, memory, speed and quality",
                    use_widget=use_widget)
