"""Notebook 03's explorer: precision and regime, live, and the lab that remembers every measurement.

Introduced in notebook 03 (mixed precision).

Choosing a precision (fp32, bf16 where the hardware has it, fp16) and a regime
(decode at batch 1, or the prefill of a long prompt) redraws three figures: the
weights' memory in each precision, the speed relative to fp32 in each regime
(timed side by side with fp32 when first chosen), and how far the logits are
from fp32's. Every measurement is kept in a `PrecisionLab`, so a setting already
measured (in the notebook, or earlier in the explorer) shows at once.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from ..lab.busy import busy_reason, load_per_core
from ..errors import LabError
from ..engine.hardware import dtype_name
from ..lab.measure import time_side_by_side
from ..plots.precision import agreement_figure, memory_figure, speed_figure
from ..lab.precision import (MIB, REGIMES, decode_run, emulation_note, logit_differences, precision_choices,
                             prefill_run, regime_label, repeat_to_length, speed_skip_reason)
from ..engine.precision import tensor_bytes
from ..lab.variants import ModelVariants
from ..lab.workloads import PrecisionWorkload
from .base import Explorer


class PrecisionLab:
    """One fp32 model, its 16-bit copies, and every measurement made on them, remembered.

    Introduced in notebook 03 (mixed precision). The notebook measures through it, and
    the explorer reuses it, so a setting measured once shows at once afterwards.
    Speeds are ratios to fp32, timed side by side in one run (`time_side_by_side`).
    workload: the sizes of each measurement (default: `PrecisionWorkload.for_device`);
    variants: the `ModelVariants` of `model` to share (default: a new one), which casts
    each 16-bit copy on first use (`precision.cast_model`).
    """

    def __init__(self, model, prompt_ids, text_ids=None, workload: PrecisionWorkload | None = None,
                 variants: ModelVariants | None = None):
        if model.dtype != torch.float32:
            raise LabError(f"PrecisionLab needs the float32 model as its reference, got {model.dtype}.")
        self.device = model.device
        self.workload = workload or PrecisionWorkload.for_device(self.device)
        self.reference = model
        self.variants = variants or ModelVariants(model)
        self.prompt_ids = list(prompt_ids)
        longest = min(self.workload.prefill_tokens, model.config.max_position)
        self.long_prompt = repeat_to_length(text_ids or prompt_ids, longest)
        self.speeds: dict[tuple[str, str], dict] = {}
        self.agreements: dict[str, dict] = {}
        self._reference_logits = None

    def model(self, name):
        """The model in dtype `name` (cast from the fp32 one on first use)."""
        return self.variants.get(name)

    def memory(self, names=None) -> dict[str, int]:
        """Bytes of each model's tensors, counted (`tensor_bytes`); default: every precision made so far."""
        return {n: tensor_bytes(self.model(n)) for n in (names or self.variants.names())}

    def _run(self, name: str, regime: str):
        if regime == "decode":
            return decode_run(self.model(name), self.prompt_ids, self.workload.decode_tokens)
        return prefill_run(self.model(name), self.long_prompt)

    def speed(self, regime: str, names) -> dict[str, dict]:
        """Speed ratio to fp32 of each dtype in `regime`; measures what is not known yet,
        fp32 alongside, in one side-by-side run. Each entry: speedup (None if skipped),
        seconds, fp32_seconds, note."""
        regime_label(regime, self.workload)                         # validates the name
        names = [dtype_name(n) for n in names]
        for name in names:
            reason = speed_skip_reason(self.device, name, regime)
            if reason and (regime, name) not in self.speeds:
                self.speeds[(regime, name)] = {"speedup": None, "seconds": None, "fp32_seconds": None,
                                               "note": reason}
        todo = [n for n in names if n != "float32" and (regime, n) not in self.speeds]
        if todo or (regime, "float32") not in self.speeds:
            runs = {n: self._run(n, regime) for n in ["float32"] + todo}
            timings = time_side_by_side(runs, self.device, repeats=self.workload.repeats)
            load = load_per_core()                                  # other programs competing?
            fp32 = timings["float32"]
            for n, timing in timings.items():
                if n == "float32" and (regime, n) in self.speeds:
                    continue
                self.speeds[(regime, n)] = {"speedup": fp32.median / timing.median, "seconds": timing.median,
                                            "fp32_seconds": fp32.median, "note": emulation_note(self.device, n),
                                            "timing": timing.to_dict(), "fp32_timing": fp32.to_dict(),
                                            "load": load}
        return {n: self.speeds[(regime, n)] for n in names}

    def busy_reason(self, regime: str | None = None) -> str | None:
        """Why the speed ratios measured so far (in `regime`, or all) cannot carry a verdict,
        or None when the machine looked quiet (`busy.busy_reason`: each ratio's repeats and
        the load probe taken right after them)."""
        rows = [((r, n), row) for (r, n), row in self.speeds.items()
                if row.get("timing") and (regime is None or r == regime)]
        timings = {f"{n} ({r})": row["timing"] for (r, n), row in rows}
        timings.update({f"float32 ({r})": row["fp32_timing"] for (r, _), row in rows})
        loads = [row["load"] for _, row in rows if row.get("load") is not None]
        return busy_reason(timings, load=max(loads, default=None))

    def speed_rows(self) -> list[dict]:
        """Every speed measured so far, as rows for `plots.precision.speed_figure`."""
        return [{"regime": regime_label(regime, self.workload), "dtype": name, **row}
                for (regime, name), row in self.speeds.items()]

    def agreement(self, name: str) -> dict:
        """Logits of the `name` model against fp32's on `agreement_tokens` of the text:
        max and mean |difference|, top-1 agreement, and every |difference| (abs_diff)."""
        name = dtype_name(name)
        if name not in self.agreements:
            tokens = torch.tensor([self.long_prompt[: self.workload.agreement_tokens]], device=self.device)
            if self._reference_logits is None:
                with torch.inference_mode():
                    self._reference_logits = self.reference.logits(self.reference(tokens)).float()
            self.agreements[name] = logit_differences(self._reference_logits, self.model(name), tokens)
        return self.agreements[name]


def memory_rows(lab: PrecisionLab, names) -> list[dict]:
    """Counted MiB of the lab's model in each precision, rows for `memory_figure`.
    Notebook 03 (mixed precision)."""
    label = f"{lab.reference.config.name} (counted from its tensors)"
    return [{"model": label, "dtype": name, "mib": nbytes / MIB} for name, nbytes in lab.memory(names).items()]


def agreement_results(lab: PrecisionLab, current: str) -> dict[str, dict]:
    """Agreement with fp32 of every precision measured so far, the current one included.
    Notebook 03 (mixed precision)."""
    if current != "float32":
        lab.agreement(current)
    return dict(lab.agreements)


def precision_explorer(model, prompt_ids=None, text_ids=None, workload: PrecisionWorkload | None = None,
                       use_widget: bool | None = None) -> Explorer:
    """Controls: precision (dropdown) and regime (decode at batch 1 / long prefill); figures:
    memory per precision, speed relative to fp32, agreement of the logits with fp32.

    Introduced in notebook 03 (mixed precision).
    model: the float32 model, or a `PrecisionLab` whose measurements are reused (then
    prompt_ids, text_ids and workload are ignored). prompt_ids: the short prompt that decode
    continues; text_ids: real text for the prefill and the agreement (default: prompt_ids).
    workload: sizes of each measurement (default: `PrecisionWorkload.for_device`, small on a CPU).
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
                speed_figure(lab.speed_rows(), highlight=(regime_label(regime, lab.workload), name),
                             busy=lab.busy_reason()),
                agreement_figure(agreement_results(lab, name), highlight=name)]

    return Explorer(controls, render, title="Precision of the weights: memory, speed and agreement with fp32",
                    use_widget=use_widget)
