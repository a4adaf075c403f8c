"""Notebook 03's explorer: precision and regime, live.

Introduced in notebook 03 (mixed precision).

Choosing a precision (fp32, bf16 where the hardware has it, fp16) and a regime
(decode at batch 1, or the prefill of a long prompt) redraws three figures: the
weights' memory in each precision, the speed relative to fp32 in each regime
(timed side by side with fp32 when first chosen), and how far the logits are
from fp32's. Every measurement is kept in a `precision.PrecisionLab`, so a
setting already measured (in the notebook, or earlier in the explorer) shows at once.
"""

from __future__ import annotations

import ipywidgets as widgets

from ..errors import LabError
from ..plots.precision import agreement_figure, memory_figure, speed_figure
from ..precision import MIB, REGIMES, PrecisionLab, Workload, precision_choices, regime_label
from .base import Explorer


def memory_rows(lab: PrecisionLab, names) -> list[dict]:
    """Counted MiB of the lab's model in each precision, rows for `memory_figure`."""
    label = f"{lab.models['float32'].config.name} (counted from its tensors)"
    return [{"model": label, "dtype": name, "mib": nbytes / MIB} for name, nbytes in lab.memory(names).items()]


def agreement_results(lab: PrecisionLab, current: str) -> dict[str, dict]:
    """Agreement with fp32 of every precision measured so far, the current one included."""
    if current != "float32":
        lab.agreement(current)
    return dict(lab.agreements)


def precision_explorer(model, prompt_ids=None, text_ids=None, workload: Workload | None = None,
                       use_widget: bool | None = None) -> Explorer:
    """Controls: precision (dropdown) and regime (decode at batch 1 / long prefill); figures:
    memory per precision, speed relative to fp32, agreement of the logits with fp32.

    Introduced in notebook 03 (mixed precision).
    model: the float32 model, or a `PrecisionLab` whose measurements are reused (then
    prompt_ids, text_ids and workload are ignored). prompt_ids: the short prompt that decode
    continues; text_ids: real text for the prefill and the agreement (default: prompt_ids).
    workload: sizes of each measurement (default: `Workload.for_device`, small on a CPU).
    """
    if isinstance(model, PrecisionLab):
        lab = model
    else:
        if prompt_ids is None:
            raise LabError("precision_explorer needs prompt_ids (a list of token ids) with a model.")
        lab = PrecisionLab(model, prompt_ids, text_ids=text_ids, workload=workload)
    choices = precision_choices(lab.device)
    start = "bfloat16" if "bfloat16" in choices else choices[0]

    controls = {
        "dtype": widgets.Dropdown(options=choices, value=start, description="precision"),
        "regime": widgets.Dropdown(options=[(regime_label(r, lab.workload), r) for r in REGIMES],
                                   value="decode", description="regime",
                                   layout=widgets.Layout(width="420px")),
    }

    def render(values: dict):
        name, regime = values["dtype"], values["regime"]
        lab.speed(regime, [name])
        return [memory_figure(memory_rows(lab, choices), highlight=name),
                speed_figure(lab.speed_rows(), highlight=(regime_label(regime, lab.workload), name)),
                agreement_figure(agreement_results(lab, name), highlight=name)]

    return Explorer(controls, render, title="Precision of the weights: memory, speed and agreement with fp32",
                    use_widget=use_widget)
