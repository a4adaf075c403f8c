"""What every benchmark section shares: the context, the reported-figure entry, the JSON.

Introduced in notebook 00 (where the time goes).

A section is a function ``(context, options) -> dict`` (see `suite.SECTIONS`). The
context (`BenchContext`) loads the model once, keeps one `ModelVariants` of it for the
whole run (every other precision and weight format is made from that one fp32 model, once,
and shared by every section and draft) and probes the machine once; the dict a section
returns holds its raw timings, what its claims function takes, and a list of `reported`
entries under ``"figures"``: one measured number each, with its unit and the course's
target. The handbook chapter's claims are judged by each section's claims function
(`suite.Section.claims`), never written into a figure. `all_figures` collects the
figures; `write_json` saves a report.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine.compiled import cudagraph_counts, graphs_verdict
from ..errors import LabError, first_line
from ..lab.measure import HF_GRAPHED, HF_UNGRAPHED
from ..lab.roofs import HardwareProfile, probe
from ..lab.timing_model import RANDOM, timed_dtype, timed_model_sentence
from ..lab.timing_model import timing_model as sixteen_bit_timing_model
from ..lab.variants import ModelVariants
from ..lab.workloads import timing_model_name
from ..weights.fixtures import random_model
from ..weights.loading import load_hf_model, load_model


def reported(name: str, value: float, unit: str, target: float | None = None,
             higher_is_better: bool = True, note: str = "", busy: str | None = None) -> dict:
    """One reported number as a JSON-ready dict: name, value, unit, target, met, note, busy.

    Introduced in notebook 00 (where the time goes). `met` says whether `value`
    reaches the course's `target` (None without a target). `busy`: why the machine looked
    busy while this figure was measured (`busy.busy_reason`), or None; a busy figure gets
    no verdict (`met` is None) and the report says to re-run. `report` turns these entries
    into tables; the chapter's claims are the section's claims table, not a figure's.
    """
    met = None
    if target is not None and busy is None:
        met = bool(value >= target) if higher_is_better else bool(value <= target)
    return {"name": name, "value": value, "unit": unit, "target": target, "met": met, "note": note,
            "busy": busy}


def failure_reason(error: BaseException) -> str:
    """A failed row's or section's reason, in one line: the error's type and its first line.
    Introduced in notebook 00 (where the time goes): the bench records a failure and goes on."""
    return first_line(error, limit=300, with_type=True)


def failed_figure(what: str, reason: str) -> dict:
    """The `reported` entry of a row or section that failed: no value, no verdict, the reason as
    its note. Introduced in notebook 00 (where the time goes)."""
    return reported(f"{what}: failed", float("nan"), "", note=reason)


class GraphCount:
    """torch's compile and CUDA-graph counts taken around a peer's warm-up, the changes our own
    decoder's warm-up reads (`compiled.cudagraph_counts`): ``with GraphCount() as count: run()``.
    Wrap the call that compiles and records (a shape's first; `first_call` does); a later one
    records nothing. Entered again, it adds that call's changes (each shape of a row compiles
    on its own first call). Introduced in notebook 00 (where the time goes): Hugging Face's
    rows are labelled by it (`hf_path`), never by assertion."""

    compiles = skips = recorded = 0

    def __enter__(self) -> "GraphCount":
        self._before = cudagraph_counts()
        return self

    def __exit__(self, *exc) -> bool:
        changes = [now - then for now, then in zip(cudagraph_counts(), self._before)]
        self.compiles, self.skips, self.recorded = (mine + change for mine, change in
                                                    zip((self.compiles, self.skips, self.recorded), changes))
        return False

    def first_call(self, fn):
        """`fn` with its first call (the one that compiles and records) counted in this count,
        its later calls (replays) run as they are. Notebook 00 (where the time goes)."""
        called = []

        def run(*args, **kwargs):
            if called:
                return fn(*args, **kwargs)
            called.append(True)
            with self:
                return fn(*args, **kwargs)
        return run

    def hf_path(self, graphed: bool) -> str:
        """The decode path of a Hugging Face row: "eager" where it was not compiled (`graphed`
        False), `measure.HF_GRAPHED` where its warm-up recorded CUDA graphs and torch skipped none,
        else a path that says it ran without them (which `measure.mark_graphed` fails on a GPU)."""
        if not graphed:
            return "eager"
        if graphs_verdict(self.skips, self.recorded) is None:
            return HF_GRAPHED
        return f"{HF_UNGRAPHED} (torch skipped {self.skips} and recorded {'some' if self.recorded else 'none'})"


@dataclass
class BenchContext:
    """What the sections share: the device, the model (loaded once, in fp32), its variants
    (one `ModelVariants` per run) and the machine profile.

    Introduced in notebook 00 (where the time goes).
    """

    device: torch.device
    model_name: str = "smollm2-135m"
    _cache: dict = field(default_factory=dict)

    def _fp32(self):
        """The fp32 model and its tokenizer, loaded on first use (the only model read from disk)."""
        key = ("ours", torch.float32)
        if key not in self._cache:
            self._cache[key] = load_model(self.model_name, device=self.device, dtype=torch.float32)
        return self._cache[key]

    @property
    def variants(self) -> ModelVariants:
        """The run's one `ModelVariants` of the fp32 model: every precision is cast from it and
        every quantized copy made from it once, whichever section or draft asks first."""
        if "variants" not in self._cache:
            self._cache["variants"] = ModelVariants(self._fp32()[0])
        return self._cache["variants"]

    def model(self, dtype=torch.float32):
        """labsupport's model in `dtype` (fp32 as loaded, any other precision cast from it by
        `variants`) and the tokenizer."""
        return self.variants.get(dtype), self._fp32()[1]

    @property
    def timing_variants(self) -> ModelVariants:
        """The variants that speed-only rows time: `variants` itself, except on a big GPU, where they
        are variants of `workloads.timing_model_name`'s random-weight model at SmolLM2-1.7B's shape
        (each precision built once on the device, each quantized copy made once from its fp32 one).
        Notebooks 00, 02, 03 and 04: sweeps and speed rows time these, quality rows `variants`."""
        name = timing_model_name(self.device)
        if name is None:
            return self.variants
        if "timing_variants" not in self._cache:
            self._cache["timing_variants"] = ModelVariants(
                factory=lambda dtype: random_model(name, seed=0, device=self.device, dtype=dtype))
        return self._cache["timing_variants"]

    @property
    def timed_model(self) -> str:
        """The name of the model `timing_variants` holds, as a section's ``timed_model`` reports it."""
        name = timing_model_name(self.device)
        return self.model_name if name is None else name + RANDOM

    def timed_note(self) -> str:
        """`timing_model.timed_model_sentence` for this run: which model the speed rows timed, and
        why; where it is not the course's, that memory and quality rows are the course's model's."""
        sentence = timed_model_sentence(self.timed_model, self.model_name)
        if self.timed_model == self.model_name:
            return sentence
        return sentence + f" Memory and quality rows are measured on {self.model_name}."

    def timing_model(self, dtype=torch.float32):
        """(model, its name) for a sweep that measures speed only: `timing_variants`' model in
        `dtype` (the course's model on a CPU). A GPU that holds the 1.7B shape only in 16-bit (a T4)
        times it in 16-bit, as notebook 00 does (`lab.timing_model.timing_model`; the name then says
        the dtype timed). Notebooks 00 and 02."""
        if timing_model_name(self.device) is None and self.device.type == "cuda":
            model, name = sixteen_bit_timing_model(self.model(dtype)[0], dtype)
            timed = timed_dtype(self.device, dtype) if name.endswith(RANDOM) else model.dtype
            return model, name if timed == dtype else f"{name} in {str(timed).removeprefix('torch.')}"
        return self.timing_variants.get(dtype), self.timed_model

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


def require_writable(path: str | Path) -> Path:
    """`path` as a Path, once a file can be written there (its folders made, an empty file
    opened for appending and, if it was new, removed again); else one sentence saying so.

    Introduced in notebook 00 (where the time goes): ``bench`` and ``tour`` check their
    outputs this way before measuring anything, so a wrong ``--out`` costs no run."""
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as error:
        raise LabError(f"Cannot write {path} ({first_line(error, with_type=True)}); choose another --out "
                       "(a path this user can write).") from None
    return path


def write_json(report: dict, path: str | Path) -> Path:
    """Save `report` as indented JSON at `path` (folders created); returns the path.

    Introduced in notebook 00 (where the time goes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    return path
