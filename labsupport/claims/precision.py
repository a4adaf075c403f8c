"""The handbook chapter's claims of notebook 03 (mixed precision), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested.
Each 16-bit format is judged by its own measurement: where fp16 was not timed (a CPU
without fp16 matrix instructions), its row says so rather than borrowing bf16's figure.
A speed verdict goes through `busy.judge`: where the repeats disagree or the load
probe saw other programs, the row says the machine was busy instead of judging.
"""

from __future__ import annotations

import torch

from ..lab.busy import BUSY_VERDICT, busy_reason, judge
from ..engine.hardware import dtype_label
from ..lab.precision import CHAPTER_GPT2_MIB, REGIMES, emulation_note, precision_choices

SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
SPEED_CLAIMS = {"float16": "fp16 ~1.5x faster than fp32",
                "bfloat16": "bf16 faster than fp32 (the chapter's ~1.5x for 16 bits)"}
QUALITY_CLAIMS = {"float16": "fp16: minimal quality loss",
                  "bfloat16": "bf16: minimal quality loss (the chapter says it of fp16)"}


def speed_verdict(ratio: float, device, emulated: bool = False) -> str:
    """The verdict on a 16-bit speed ratio to fp32: "holds" from 1.3x to 2.2x ("more" above),
    "partly" from 1.05x, "not" below. Introduced in notebook 03 (mixed precision)."""
    place = "on this GPU" if torch.device(device).type == "cuda" else "on this CPU"
    if emulated:
        place += " (emulated 16-bit)"
    if ratio >= 1.3:
        return f"holds {place}" if ratio <= 2.2 else f"more {place}"
    if ratio >= 1.05:
        return f"partly {place}: faster, but less than claimed"
    return f"not {place}"


def _memory_row(model_name: str, memory: dict[str, int], gpt2_mib: dict[str, float]) -> dict:
    """16-bit weights take half the bytes: GPT-2 from its config, the lab's model from its tensors."""
    fractions = {SHORT[n]: memory[n] / memory["float32"] for n in memory if n != "float32"}
    gpt2_matches = all(round(gpt2_mib[n], 1) == CHAPTER_GPT2_MIB[n] for n in CHAPTER_GPT2_MIB)   # to the decimal
    halves = bool(fractions) and all(abs(f - 0.5) < 0.01 for f in fractions.values())
    counted = ", ".join(f"{name} {f:.1%}" for name, f in fractions.items()) or "no 16-bit copy made"
    return {"topic": "memory", "format": ", ".join(fractions) or "-",
            "claim": "16 bits halve the memory (GPT-2: 474.7 MB -> 237.4 MB)",
            "measured": f"GPT-2 counted from its config: {gpt2_mib['float32']:.1f} -> {gpt2_mib['float16']:.1f} MiB; "
                        f"{model_name} counted from its tensors: {counted} of fp32",
            "verdict": ("holds (the chapter's MB are MiB)" if halves and gpt2_matches else
                        "partly: " + ("GPT-2's count differs from the chapter's" if halves else
                                      "the counted tensors are not half of fp32's"))}


def _speed_row(device, speeds: dict, regime: str, name: str, load: float | None) -> dict:
    """One format in one regime, judged by its own timing (or saying why it was not timed)."""
    row = speeds.get((regime, name))
    result = {"topic": f"speed ({regime})", "format": SHORT[name], "claim": SPEED_CLAIMS[name]}
    if row is None or row["speedup"] is None:
        reason = (row or {}).get("note") or emulation_note(device, name) or "not timed in this run"
        return {**result, "measured": reason, "verdict": "not timed here"}
    reason = busy_reason({"fp32": row["fp32_timing"], SHORT[name]: row["timing"]},
                         load=row.get("load") if load is None else load) if row.get("timing") else None
    label = dtype_label(device, name)
    return {**result,
            "measured": f"{row['speedup']:.2f}x ({label}: {row['seconds'] * 1e3:.1f} ms against "
                        f"fp32's {row['fp32_seconds'] * 1e3:.1f} ms)",
            "verdict": judge(speed_verdict(row["speedup"], device, bool(emulation_note(device, name))),
                             reason)}


def _quality_row(agreements: dict, name: str) -> dict:
    """One format's logits against fp32's: "holds" when the top-1 token agrees at 95% of the positions."""
    result = {"topic": "quality", "format": SHORT[name], "claim": QUALITY_CLAIMS[name]}
    agreement = agreements.get(name)
    if agreement is None:
        return {**result, "measured": "not measured in this run", "verdict": "not measured here"}
    top1 = agreement["top1_agreement"]
    return {**result,
            "measured": f"top-1 token same as fp32 at {top1:.1%} of the positions; logits differ by "
                        f"{agreement['mean_abs_diff']:.3g} on average, {agreement['max_abs_diff']:.3g} at most",
            "verdict": "holds" if top1 >= 0.95 else "partly: some top-1 tokens change"}


def precision_claims(lab, gpt2_mib: dict[str, float], load: float | None = None) -> list[dict]:
    """The handbook chapter's precision claims set against `lab`'s measurements
    (an `explorers.precision.PrecisionLab`), one row per claim and 16-bit format.

    Introduced in notebook 03 (mixed precision). gpt2_mib: GPT-2's counted MiB per dtype
    ({"float32": ..., "float16": ...}). Rows: topic, format, claim, measured, verdict.
    Memory "holds" when every 16-bit copy is within 1% of half of fp32 and GPT-2's count
    rounds to the chapter's figures. Speed, per format and regime from its own timing
    (`speed_verdict`: "holds" from 1.3x to 2.2x, "partly" from 1.05x), through `busy.judge`
    with the load recorded beside each timing (or `load`, when given). Quality "holds"
    when the top-1 token agrees with fp32 at 95% of the positions or more.
    """
    return measured_precision_claims(lab.device, lab.reference.config.name, lab.memory(), lab.speeds,
                                     lab.agreements, gpt2_mib, load)


def measured_precision_claims(device, model_name: str, memory: dict[str, int], speeds: dict, agreements: dict,
                              gpt2_mib: dict[str, float], load: float | None = None) -> list[dict]:
    """`precision_claims` from the measurements themselves: memory {dtype name: bytes}; speeds
    {(regime, dtype name): {"speedup", "seconds", "fp32_seconds", "note", "timing",
    "fp32_timing", "load"}}; agreements {dtype name: {"top1_agreement", "mean_abs_diff",
    "max_abs_diff"}}. Introduced in notebook 03 (mixed precision); the bench's section uses it."""
    half = [n for n in precision_choices(device) if n != "float32"]
    rows = [_memory_row(model_name, memory, gpt2_mib)]
    rows += [_speed_row(device, speeds, regime, name, load) for regime in REGIMES for name in half]
    rows += [_quality_row(agreements, name) for name in half]
    return rows


def precision_section_claims(section: dict) -> list[dict]:
    """The precision bench section's claims (`measured_precision_claims`) from its dict: its
    ``memory_bytes``, ``speeds`` by regime, each row's agreement, ``gpt2_mib``, ``device``,
    ``model_name`` and the suite's ``load_per_core``. Introduced in notebook 03 (mixed precision)."""
    speeds = {(regime, name): row for regime, rows in section["speeds"].items() for name, row in rows.items()}
    agreements = {name: row for name, row in section["models"].items() if "top1_agreement" in row}
    return measured_precision_claims(section["device"], section["model_name"], section["memory_bytes"], speeds,
                                     agreements, section["gpt2_mib"], section.get("load_per_core"))


# How each kind of verdict reads in a sentence, in the order the sentences list them.
VERDICT_PHRASES = {"holds": "holds for", "partly": "holds only in part for", "not": "does not hold for",
                   "untimed": "was not measured here for",
                   "busy": "gets no verdict (the machine was busy: re-run) for"}


def verdict_kind(verdict: str) -> str:
    """ "holds", "partly", "not", "untimed" or "busy": the kind of a claims-table verdict.
    Introduced in notebook 03 (mixed precision); notebook 04's conclusions use it too."""
    if verdict.startswith(BUSY_VERDICT):
        return "busy"
    if verdict.startswith(("not timed", "not measured")):
        return "untimed"
    if verdict.startswith(("holds", "more")):
        return "holds"
    return "partly" if verdict.startswith("partly") else "not"


def summarize_verdicts(rows: list[dict], name_key: str = "format") -> str:
    """One Markdown bullet per topic of a claims table, built from its verdicts: for which
    rows (named by `name_key`) the claim holds, holds in part, does not hold, was not
    measured, or got no verdict because the machine was busy.

    Introduced in notebook 03 (mixed precision); notebook 04 uses it too.
    """
    topics: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        kinds = topics.setdefault(row["topic"], {})
        kinds.setdefault(verdict_kind(row["verdict"]), []).append(str(row[name_key]))
    bullets = []
    for topic, kinds in topics.items():
        parts = [f"{VERDICT_PHRASES[kind]} {', '.join(kinds[kind])}" for kind in VERDICT_PHRASES if kind in kinds]
        bullets.append(f"* **{topic}**: the claim " + "; ".join(parts) + ".")
    return "\n".join(bullets)
