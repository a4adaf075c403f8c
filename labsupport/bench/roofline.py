"""Notebook 00's second section: the decode step swept over batch sizes, on this machine's roofline.

Introduced in notebook 00 (where the time goes); ``python -m labsupport bench --sections roofline``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..claims.roofline import sweep_busy_reason
from ..lab.roofline import growth_batch, ridge_batch, supported_dtypes, sweep_decode
from ..lab.workloads import PRESETS
from .core import BenchContext, reported
from .options import SectionOptions, count, counts


@dataclass(frozen=True)
class RooflineOptions(SectionOptions):
    """The roofline section's options. Introduced in notebook 00 (where the time goes).

    batches: batch sizes of the decode-step sweep (past the ridge: dozens on a CPU, hundreds on
    a GPU: `workloads.PRESETS`' ``roofline_batches``); context: cached positions behind each
    timed step; repeats: timed repeats of each step."""

    SECTION = "roofline"
    batches: tuple[int, ...] = counts(PRESETS["cpu"].roofline_batches)
    context: int = count(64)
    repeats: int = count(3)

    @classmethod
    def gpu_sizes(cls) -> dict:
        return {"batches": PRESETS["gpu"].roofline_batches}


def section_roofline(ctx: BenchContext, options: RooflineOptions) -> dict:
    """Decode-step sweep over batch sizes per dtype, placed on this machine's roofline.

    Introduced in notebook 00 (where the time goes). About 30 s on a 2-core CPU. A sweep
    whose repeats disagree, or whose step time falls steeply as the batch grows
    (`claims.roofline.sweep_busy_reason`), gets no verdict on its figures. Its claims:
    `claims.roofline.roofline_section_claims` (the sweeps and the hardware profile).
    """
    profile = ctx.hardware
    context, repeats, batches = options.context, options.repeats, list(options.batches)
    sweeps, figures = {}, []
    for name in supported_dtypes(profile):
        dtype = getattr(torch, name)
        model, timed = ctx.timing_model(dtype)        # on a big GPU, a model at 1.7B's shape
        rows = sweep_decode(model, batches, context, repeats)
        sweeps[name] = rows
        predicted = ridge_batch(profile, model.config, dtype, context)
        grows_at = growth_batch(rows)
        busy = sweep_busy_reason(rows)          # the load probe is the suite's (mark_busy)
        first, last = rows[0], rows[-1]
        figures += [
            reported(f"measured ridge point ({name})", profile.ridge(name), "FLOP/byte",
                     note=f"{profile.flops[name] / 1e9:.0f} GFLOP/s / {profile.bandwidth / 1e9:.1f} GB/s"),
            reported(f"batch where the decode step time passes 1.5x batch 1 ({name})",
                     float(grows_at) if grows_at else float("nan"), "batch", busy=busy,
                     note=f"predicted ridge batch {predicted:.1f} (context {context}); "
                          f"swept {rows[0]['batch']}..{rows[-1]['batch']}; model {timed}"
                          + (f"; {rows.note}" if rows.note else "")),
            reported(f"decode tokens/s at batch {last['batch']} / batch 1 ({name})",
                     last["tokens_per_s"] / first["tokens_per_s"], "x", busy=busy,
                     note=f"{first['tokens_per_s']:.0f} -> {last['tokens_per_s']:.0f} tokens/s; "
                          f"step {1e3 * first['seconds']:.1f} -> {1e3 * last['seconds']:.1f} ms"),
        ]
    return {"context": context, "batches": list(batches), "hardware": profile.to_dict(),
            "capped": {name: rows.note for name, rows in sweeps.items() if rows.note},   # points left out to fit
            "timed_model": timed if sweeps else ctx.model_name,     # the last sweep's model (one per run)
            "sweeps": sweeps, "figures": figures}
