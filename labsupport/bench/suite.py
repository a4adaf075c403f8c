"""The suite: every benchmark section in the course's order (`SECTIONS`, the only list of them),
the options of a whole run (`BenchOptions`: one of each section's), and the loop that runs them
into one report (`run`).

Introduced in notebook 00 (where the time goes). ``python -m labsupport bench`` and
``python -m labsupport tour`` call `run`; `report` reads each section's notebook, claims and
plots from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping

from .. import claims
from ..engine.hardware import pick_device
from ..errors import LabError, ModelUnavailable
from ..inputs import whole_number
from ..lab.busy import busy_reason, load_per_core
from ..lab.progress import section_bar
from ..plots import sections as plots
from . import (baseline, batching, compiled_decode, engines, http_serving, kv_cache, long_context, precision,
               quantization, roofline, serving, speculative, stack, tensor_parallel)
from .compile_options import CompileOptions
from .core import BenchContext, failed_figure, failure_reason, machine_info
from .options import SectionOptions


@dataclass(frozen=True)
class Section:
    """One benchmark section: the notebook it measures, its function ``(context, options) -> dict``,
    its options class, its claims (the section's dict -> the chapter's claims with verdicts,
    None for a section the chapter makes no claim about) and its plots (the section's dict ->
    plotly figures, `plots.sections`).

    Introduced in notebook 00 (where the time goes). Calling it runs the function."""

    notebook: str
    run: Callable[[BenchContext, SectionOptions], dict]
    options: type
    claims: Callable[[dict], list[dict]] | None
    figures: Callable[[dict], list]
    in_default_run: bool = True       # False: runs only when named (--sections), being long

    def __call__(self, ctx: BenchContext, options: SectionOptions) -> dict:
        return self.run(ctx, options)


SECTIONS: dict[str, Section] = {
    "baseline": Section("00 where the time goes", baseline.section_baseline, baseline.BaselineOptions, None,
                        plots.baseline_figures),
    "engines": Section("00 where the time goes", engines.section_engines, engines.EnginesOptions, None,
                       plots.engines_figures),
    "roofline": Section("00 where the time goes", roofline.section_roofline, roofline.RooflineOptions,
                        claims.roofline_section_claims, plots.roofline_figures),
    "kv_cache": Section("01 KV cache", kv_cache.section_kv_cache, kv_cache.KVCacheOptions,
                        claims.kv_cache_section_claims, plots.kv_cache_figures),
    "batching": Section("02 batching", batching.section_batching, batching.BatchingOptions,
                        claims.batching_section_claims, plots.batching_figures),
    "precision": Section("03 mixed precision", precision.section_precision, precision.PrecisionOptions,
                         claims.precision_section_claims, plots.precision_figures),
    "quantization": Section("04 quantization", quantization.section_quantization,
                            quantization.QuantizationOptions, claims.quantization_section_claims,
                            plots.quantization_figures),
    "speculative": Section("05 speculative decoding", speculative.section_speculative,
                           speculative.SpeculativeOptions, claims.speculative_section_claims,
                           plots.speculative_figures),
    "serving": Section("06 continuous batching", serving.section_serving, serving.ServingOptions,
                       claims.serving_section_claims, plots.serving_figures),
    "stack": Section("07 putting it together", stack.section_stack, stack.StackOptions,
                     claims.stack_section_claims, plots.stack_figures),
    "compile": Section("07 putting it together", compiled_decode.section_compile, CompileOptions, None,
                       plots.compile_figures, in_default_run=False),
    "long_context": Section("08 long context", long_context.section_long_context,
                            long_context.LongContextOptions, claims.long_context_section_claims,
                            plots.long_context_figures),
    "http_serving": Section("09 serving over HTTP", http_serving.section_http_serving,
                            http_serving.HttpServingOptions, None, plots.http_serving_figures,
                            in_default_run=False),
    "tensor_parallel": Section("10 past one device", tensor_parallel.section_tensor_parallel,
                               tensor_parallel.TensorParallelOptions, claims.tensor_parallel_section_claims,
                               plots.tensor_parallel_figures,
                               in_default_run=False),
}


# Seconds each section took on the course's reference machine (a quiet 2-core AMD EPYC, CPU
# preset, the tour of 2026-12-02; compile: a rough figure; http_serving: with its llama-server peer, its
# agentic workload and its quality rows, on a quiet 2-core Intel Xeon, 2026-12-06): the progress bars'
# estimate where this machine has no report yet.
REFERENCE_SECONDS = {"baseline": 58, "engines": 150, "roofline": 6, "kv_cache": 117, "batching": 127,
                     "precision": 20, "quantization": 34, "speculative": 131, "serving": 126, "stack": 60,
                     "long_context": 8, "compile": 300, "http_serving": 200,
                     "tensor_parallel": 80}


@dataclass(frozen=True)
class BenchOptions:
    """The options of a whole run: one of each section's options class, by section name
    (`SECTIONS`); ``options["kv_cache"]`` or ``options.kv_cache`` reads one.

    Introduced in notebook 00 (where the time goes). Build it with a preset: `cpu()`,
    `gpu()` or `for_device(device)`, each taking per-section changes, as options or as a
    dict of fields (``BenchOptions.cpu(kv_cache={"lengths": (4,)})``); `changed` makes such
    changes to any options; `from_cli` spreads the
    command line's flags over every section; `to_dict` is what a report's ``"options"`` holds.
    """

    sections: Mapping[str, SectionOptions]

    def __post_init__(self):
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise LabError(f"Unknown section(s) {unknown} in the options; choose from {sorted(SECTIONS)}.")
        for name, options in self.sections.items():
            if not isinstance(options, SECTIONS[name].options):
                raise LabError(f"The options of section {name} must be a {SECTIONS[name].options.__name__}, "
                               f"got {type(options).__name__}.")
        missing = [name for name in SECTIONS if name not in self.sections]
        if missing:
            raise LabError(f"BenchOptions needs the options of every section; {missing} missing: build it with "
                           "BenchOptions.cpu(), .gpu() or .for_device(device).")
        object.__setattr__(self, "sections", MappingProxyType({n: self.sections[n] for n in SECTIONS}))

    def __reduce__(self):                         # copy and pickle through a plain dict of the sections
        return type(self), (dict(self.sections),)

    def __getitem__(self, name: str) -> SectionOptions:
        if name not in self.sections:
            raise LabError(f"No section named {name!r}; choose from {sorted(SECTIONS)}.")
        return self.sections[name]

    def __getattr__(self, name: str) -> SectionOptions:
        sections = self.__dict__.get("sections", {})
        if name not in sections:                  # an AttributeError, so that getattr(..., default) works
            raise AttributeError(f"BenchOptions has no section {name!r}; choose from {sorted(SECTIONS)}.")
        return sections[name]

    def changed(self, **changes) -> BenchOptions:
        """These options with `changes`: section name -> its new options, or a dict of the fields
        to change (``options.changed(kv_cache={"lengths": (4,)})``). Introduced in notebook 00."""
        sections = dict(self.sections)
        for name, change in changes.items():
            if name not in SECTIONS:
                raise LabError(f"Unknown section {name!r} in the options; choose from {sorted(SECTIONS)}.")
            sections[name] = replace(sections[name], **change) if isinstance(change, Mapping) else change
        return type(self)(sections)

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def _preset(cls, kind: str, changes: dict) -> BenchOptions:
        presets = {name: section.options.gpu() if kind == "gpu" else section.options.cpu()
                   for name, section in SECTIONS.items()}
        return cls(presets).changed(**changes)

    @classmethod
    def cpu(cls, **changes) -> BenchOptions:
        """Every section's CPU preset, with `changes` (section name -> options or a dict of fields).
        Introduced in notebook 00."""
        return cls._preset("cpu", changes)

    @classmethod
    def gpu(cls, **changes) -> BenchOptions:
        """Every section's GPU preset (`workloads.PRESETS["gpu"]`: longer sweeps, a larger serving
        workload, every compile row), with `changes`. Introduced in notebook 00."""
        return cls._preset("gpu", changes)

    @classmethod
    def for_device(cls, device, **changes) -> BenchOptions:
        """`gpu()` on a CUDA device, `cpu()` anywhere else. Introduced in notebook 00."""
        from ..lab.workloads import device_class
        return cls.gpu(**changes) if device_class(device) == "gpu" else cls.cpu(**changes)

    @classmethod
    def from_cli(cls, device, new_tokens: int | None = None, repeats: int | None = None,
                 kv_lengths=None, all_peers: bool = False) -> BenchOptions:
        """The preset for `device` with the command line's flags spread over every section.

        Introduced in notebook 00. ``--new-tokens`` sets each section's ``new_tokens``
        (`SectionOptions.with_counts`; quantization's at least 2, its slow rows never above
        it); ``--repeats`` every field ending in ``repeats``; ``--kv-lengths`` the KV-cache
        section's ``lengths``. None leaves the preset. ``--all-peers``: the engines
        section's slow rows too (`engines.EnginesOptions.with_all_peers`).
        """
        if new_tokens is not None:
            whole_number(new_tokens, "new_tokens")
        if repeats is not None:
            whole_number(repeats, "repeats")
        options = cls.for_device(device)
        sections = {name: o.with_counts(new_tokens, repeats) for name, o in options.sections.items()}
        if kv_lengths is not None:
            sections["kv_cache"] = replace(sections["kv_cache"], lengths=kv_lengths)
        if all_peers:
            sections["engines"] = sections["engines"].with_all_peers()
        return cls(sections)

    def to_dict(self) -> dict:
        """{section: its fields}, lists as lists: what a report's ``"options"`` holds."""
        return {name: options.to_dict() for name, options in self.sections.items()}


def run(sections=None, device=None, model_name: str = "smollm2-135m", options: BenchOptions | None = None,
        progress=print, bars: bool = False, previous: dict | None = None) -> dict:
    """Run the named sections (default: all but those marked not `in_default_run`, in the course's
    order) and return one report dict: created, model, options, machine, and each section's dict
    (with the seconds it took, the load after it, and its ``"claims"``: the rows of its claims
    function, `Section.claims`, computed from that dict).

    Introduced in notebook 00 (where the time goes). options: default, the preset for
    the device (`BenchOptions.for_device`). An unknown section name is one sentence. bars: a
    progress bar per section (`lab.progress`), estimated from `previous` (an earlier report of
    this machine, its sections' seconds) or else `REFERENCE_SECONDS`.
    """
    unknown = sorted(set(sections or ()) - set(SECTIONS))
    if unknown:
        raise LabError(f"Unknown section(s) {unknown}; choose from {sorted(SECTIONS)}.")
    ctx = BenchContext(device=pick_device(device), model_name=model_name)
    options = options if options is not None else BenchOptions.for_device(ctx.device)
    report = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model_name,
              "options": options.to_dict(), "machine": machine_info(ctx), "sections": {}}
    for name in sections or [name for name, section in SECTIONS.items() if section.in_default_run]:
        start = time.perf_counter()
        if not bars:
            progress(f"[bench] {name} ...")
        section = report["sections"][name] = _run_section(name, ctx, options[name], bars, previous)
        if "failed" in section:
            progress(f"[bench] {name} failed ({section['failed']}); the run goes on")
        section["seconds"] = time.perf_counter() - start
        section["load_per_core"] = load_per_core()
        mark_busy(section, busy_reason(load=section["load_per_core"]))
        if SECTIONS[name].claims is not None and "failed" not in section:
            section["claims"] = SECTIONS[name].claims(section)
    return report


def _run_section(name: str, ctx: BenchContext, options: SectionOptions, bars: bool, previous: dict | None) -> dict:
    """Section `name`'s dict, or, where it raised, a failed section: ``"failed"`` (its one-line
    reason) and one figure saying so, so that the run goes on (issue 51: one GPU-only failure
    ended the whole bench and tour). A model that cannot be had ends the run, in one sentence."""
    try:
        if bars:
            with section_bar(name, *_estimate(name, previous)):
                return SECTIONS[name](ctx, options)
        return SECTIONS[name](ctx, options)
    except ModelUnavailable:                       # every section needs the model: the run cannot go on
        raise
    except Exception as error:                     # noqa: BLE001 - recorded in the report, the run goes on
        reason = failure_reason(error)
        return {"failed": reason, "figures": [failed_figure(f"section {name}", reason)]}


def _estimate(name: str, previous: dict | None) -> tuple[float, str]:
    """(seconds, where the figure comes from) that section `name` should take here."""
    seconds = ((previous or {}).get("sections", {}).get(name) or {}).get("seconds")
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 < seconds < float("inf"):
        return float(seconds), "estimate: its last run here"
    return float(REFERENCE_SECONDS.get(name, 60)), "estimate: a 2-core CPU"


def mark_busy(section: dict, reason: str | None) -> None:
    """Withhold the verdict of every figure of `section` measured while the machine was busy.

    Introduced in notebook 00 (where the time goes). reason: `busy.busy_reason`'s
    sentence (the load probe taken when the section ended), or None for a quiet run; a
    figure that already carries its own reason (its spread) keeps it.
    """
    if reason is None:
        return
    for figure in section.get("figures", []):
        if not figure.get("busy"):
            figure["busy"], figure["met"] = reason, None
