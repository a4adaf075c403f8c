"""What every benchmark section shares: the context, the reported-figure entry, the JSON.

Introduced in notebook 00 (where the time goes).

A section is a function ``(context, options) -> dict`` (see `suite.SECTIONS`). The
context (`BenchContext`) loads each model once and probes the machine once; the dict
a section returns holds its raw timings and a list of `reported` entries under
``"figures"``: one measured number each, with its unit, the course's target and the
handbook chapter's claim. `all_figures` collects them; `write_json` saves a report.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..lab.roofs import HardwareProfile, probe
from ..weights.loading import load_hf_model, load_model


def reported(name: str, value: float, unit: str, target: float | None = None,
             higher_is_better: bool = True, claim: str | None = None, note: str = "",
             busy: str | None = None) -> dict:
    """One reported number as a JSON-ready dict: name, value, unit, target, met, claim, note, busy.

    Introduced in notebook 00 (where the time goes). `met` says whether `value`
    reaches the course's `target` (None without a target); `claim` is the handbook
    chapter's claim it is set against. `busy`: why the machine looked busy while this
    figure was measured (`busy.busy_reason`), or None; a busy figure gets no verdict
    (`met` is None) and the report says to re-run. `report` turns these entries into
    tables and plots.
    """
    met = None
    if target is not None and busy is None:
        met = bool(value >= target) if higher_is_better else bool(value <= target)
    return {"name": name, "value": value, "unit": unit, "target": target, "met": met,
            "claim": claim, "note": note, "busy": busy}


@dataclass
class BenchContext:
    """What the sections share: the device, the models (each loaded once) and the machine profile.

    Introduced in notebook 00 (where the time goes).
    """

    device: torch.device
    model_name: str = "smollm2-135m"
    _cache: dict = field(default_factory=dict)

    def model(self, dtype=torch.float32):
        """labsupport's model and tokenizer in `dtype`, loaded on first use."""
        key = ("ours", dtype)
        if key not in self._cache:
            self._cache[key] = load_model(self.model_name, device=self.device, dtype=dtype)
        return self._cache[key]

    def hf_model(self, dtype=torch.float32):
        """The same weights as a Hugging Face transformers model, loaded on first use."""
        key = ("hf", dtype)
        if key not in self._cache:
            self._cache[key] = load_hf_model(self.model_name, device=self.device, dtype=dtype)
        return self._cache[key]

    @property
    def hardware(self) -> HardwareProfile:
        """This machine's measured bandwidth and FLOP/s (`roofs.probe`), probed once."""
        if "hardware" not in self._cache:
            self._cache["hardware"] = probe(self.device)
        return self._cache["hardware"]


def machine_info(ctx: BenchContext) -> dict:
    """The machine a report was measured on: device, torch, python, threads, measured profile.

    Introduced in notebook 00 (where the time goes)."""
    hw = ctx.hardware
    return {"device": str(ctx.device), "device_name": hw.name, "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(),
            "hardware": hw.to_dict()}


def all_figures(report: dict) -> list[dict]:
    """Every `reported` entry of a report, section after section.

    Introduced in notebook 00 (where the time goes)."""
    return [f for section in report["sections"].values() for f in section.get("figures", [])]


def write_json(report: dict, path: str | Path) -> Path:
    """Save `report` as indented JSON at `path` (folders created); returns the path.

    Introduced in notebook 00 (where the time goes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    return path
