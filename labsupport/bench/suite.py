"""The suite: every benchmark section in the course's order (`SECTIONS`), and the loop that
runs them into one report (`run`).

Introduced in notebook 00 (where the time goes). ``python -m labsupport bench`` and
``python -m labsupport tour`` call `run`; `report` names each section's notebook from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..lab.busy import busy_reason, load_per_core
from ..errors import LabError
from ..engine.hardware import pick_device
from . import (baseline, batching, compiled_decode, engines, kv_cache, precision, quantization, roofline,
               serving, speculative, stack)
from . import long_context
from . import http_serving
from .core import BenchContext, machine_info
from .options import BenchOptions


@dataclass(frozen=True)
class Section:
    """One benchmark section: the notebook it measures, and its function ``(context, options) -> dict``.

    Introduced in notebook 00 (where the time goes). Calling it runs the function."""

    notebook: str
    run: Callable[[BenchContext, BenchOptions], dict]
    in_default_run: bool = True       # False: runs only when named (--sections), being long

    def __call__(self, ctx: BenchContext, options: BenchOptions) -> dict:
        return self.run(ctx, options)


SECTIONS: dict[str, Section] = {
    "baseline": Section("00 where the time goes", baseline.section_baseline),
    "engines": Section("00 where the time goes", engines.section_engines),
    "roofline": Section("00 where the time goes", roofline.section_roofline),
    "kv_cache": Section("01 KV cache", kv_cache.section_kv_cache),
    "batching": Section("02 batching", batching.section_batching),
    "precision": Section("03 mixed precision", precision.section_precision),
    "quantization": Section("04 quantization", quantization.section_quantization),
    "speculative": Section("05 speculative decoding", speculative.section_speculative),
    "serving": Section("06 continuous batching", serving.section_serving),
    "stack": Section("07 putting it together", stack.section_stack),
    "compile": Section("07 putting it together", compiled_decode.section_compile, in_default_run=False),
    "long_context": Section("08 long context", long_context.section_long_context),
    "http_serving": Section("09 serving over HTTP", http_serving.section_http_serving, in_default_run=False),
}


def run(sections=None, device=None, model_name: str = "smollm2-135m", options: BenchOptions | None = None,
        progress=print) -> dict:
    """Run the named sections (default: all but those marked not `in_default_run`, in the course's
    order) and return one report dict:
    created, model, options, machine, and each section's dict (with the seconds it took).

    Introduced in notebook 00 (where the time goes). options: default, the preset for
    the device (`BenchOptions.for_device`). An unknown section name is one sentence.
    """
    unknown = sorted(set(sections or ()) - set(SECTIONS))
    if unknown:
        raise LabError(f"Unknown section(s) {unknown}; choose from {sorted(SECTIONS)}.")
    ctx = BenchContext(device=pick_device(device), model_name=model_name)
    options = options if options is not None else BenchOptions.for_device(ctx.device)
    report = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model_name,
              "options": options.to_dict(), "machine": machine_info(ctx), "sections": {}}
    for name in sections or [name for name, section in SECTIONS.items() if section.in_default_run]:
        progress(f"[bench] {name} ...")
        start = time.perf_counter()
        section = report["sections"][name] = SECTIONS[name](ctx, options)
        section["seconds"] = time.perf_counter() - start
        section["load_per_core"] = load_per_core()
        mark_busy(section, busy_reason(load=section["load_per_core"]))
    return report


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
