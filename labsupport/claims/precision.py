"""The handbook chapter's claims of notebook 03 (mixed precision), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested."""

from __future__ import annotations

import torch

from ..hardware import dtype_label
from ..precision import REGIMES, emulation_note


def _speed_verdict(ratio: float | None, device, emulated: bool = False) -> str:
    """The verdict on a 16-bit speed ratio: "holds" from 1.3x to 2.2x, "partly" from 1.05x."""
    if ratio is None:
        return "not measured here"
    place = "on this GPU" if torch.device(device).type == "cuda" else "on this CPU"
    if emulated:
        place += " (emulated 16-bit)"
    if ratio >= 1.3:
        return f"holds {place}" if ratio <= 2.2 else f"more {place}"
    if ratio >= 1.05:
        return f"partly {place}: faster, but less than claimed"
    return f"not {place}"


def precision_claims(lab, gpt2_mib: dict[str, float]) -> list[dict]:
    """The handbook chapter's precision claims set against `lab`'s measurements
    (an `explorers.precision.PrecisionLab`).

    Introduced in notebook 03 (mixed precision). gpt2_mib: GPT-2's counted MiB per dtype
    ({"float32": ..., "float16": ...}). Speed: the best 16-bit ratio measured in each regime
    ("holds" from 1.3x to 2.2x, "partly" from 1.05x); quality: "holds" when the top-1 token
    agrees with fp32 at 95% of the positions or more.
    """
    memory = lab.memory()
    half = [n for n in memory if n != "float32"]
    fraction = min(memory[n] for n in half) / memory["float32"] if half else float("nan")
    speeds = {regime: [(row["speedup"], name) for (r, name), row in lab.speeds.items()
                       if r == regime and name != "float32" and row["speedup"] is not None]
              for regime in REGIMES}
    best = {regime: max(values) if values else (None, "-") for regime, values in speeds.items()}

    def speed_text(regime):
        ratio, name = best[regime]
        return (f"{regime}: {ratio:.2f}x ({dtype_label(lab.device, name)})" if ratio is not None
                else f"{regime}: not measured")

    agreements = {n: a for n, a in lab.agreements.items()}
    worst = min(((a["top1_agreement"], n) for n, a in agreements.items()), default=(None, "-"))
    model_name = lab.reference.config.name
    rows = [
        {"claim": "fp16 halves the memory (GPT-2: 474.7 MB -> 237.4 MB)",
         "measured": f"GPT-2 counted from its config: {gpt2_mib['float32']:.1f} -> {gpt2_mib['float16']:.1f} MiB; "
                     f"{model_name} counted from its tensors: {fraction:.1%} of fp32",
         "verdict": "holds (the chapter's MB are MiB)" if abs(fraction - 0.5) < 0.01 else "partly"},
    ]
    for regime in REGIMES:
        rows.append({"claim": f"fp16 ~1.5x faster ({regime}); \"faster on modern GPUs\"",
                     "measured": speed_text(regime),
                     "verdict": _speed_verdict(best[regime][0], lab.device,
                                               emulated=bool(emulation_note(lab.device, best[regime][1])))
                     if best[regime][0] is not None else "not measured here"})
    top1, name = worst
    rows.append({"claim": "fp16: minimal quality loss",
                 "measured": (f"top-1 token same as fp32 at {top1:.1%} of positions ({name}, the worst); "
                              f"max logit difference {agreements[name]['max_abs_diff']:.3g}")
                             if top1 is not None else "not measured",
                 "verdict": "holds" if top1 is not None and top1 >= 0.95 else
                            ("not measured" if top1 is None else "partly: some top-1 tokens change")})
    return rows
