"""The handbook chapter's claims of notebook 04 (quantization), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested.

The chapter's table gives each format a memory share, a speed-up over fp32 and a
quality. Memory is judged on the resident bytes (the footprint the chapter means),
with the bytes a decode step reads beside them; speed on the decode ratio to fp32,
with the ratio to bf16 beside it (the fast int8/int4 kernels compute in bf16, so part
of the gain over fp32 is bf16's); every speed verdict goes through `busy.judge`.
"""

from __future__ import annotations

import math

from ..lab.busy import busy_reason, judge
from .precision import summarize_verdicts

QUANTIZATION_CLAIMS = {  # the handbook chapter's claims: (memory, speed), per format
    "fp16": ("50% of fp32", "~1.5x"), "bf16": ("50% of fp32", "~1.5x (as fp16)"),
    "int8": ("25% of fp32", "~2x"), "int4": ("12.5% of fp32", "~3x"),
}
# The same claims as numbers: memory share of fp32, speed-up over fp32, quality loss.
CHAPTER_FIGURES = {"fp16": (0.50, 1.5, "minimal"), "bf16": (0.50, 1.5, "minimal"),
                   "int8": (0.25, 2.0, "small"), "int4": (0.125, 3.0, "noticeable")}
LOSSES = ("minimal", "small", "noticeable")       # perplexity up < 2%, < 10%, more
MEMORY_SLACK = 0.05                                 # scales, zeros and padding: 5 points of fp32 allowed


def chapter_format(row: str) -> str | None:
    """The chapter's format a row stands for: "int4 g32" and "bnb nf4" -> "int4", "bnb int8" -> "int8",
    "bf16" -> "bf16"; None for a row the chapter has no claim for. Introduced in notebook 04 (quantization)."""
    key = "int4" if row.startswith("int4") or row == "bnb nf4" else "int8" if row.endswith("int8") else row
    return key if key in CHAPTER_FIGURES else None


def quantization_claim(row: str, which: int) -> str | None:
    """The chapter's claim for one row of the quantization benchmark (`bench.quantization`):
    its memory (which=0) or its speed (which=1), None where the chapter makes none.

    Introduced in notebook 04 (quantization). int4 rows and bitsandbytes NF4 share int4's
    claims, bitsandbytes int8 shares int8's.
    """
    key = chapter_format(row)
    return QUANTIZATION_CLAIMS[key][which] if key in QUANTIZATION_CLAIMS else None


def loss_of(perplexity_increase: float) -> str:
    """ "minimal" below a 2% rise in perplexity, "small" below 10%, else "noticeable".
    Introduced in notebook 04 (quantization)."""
    return LOSSES[0] if perplexity_increase < 0.02 else LOSSES[1] if perplexity_increase < 0.10 else LOSSES[2]


def memory_verdict(resident: float, read: float, claimed: float) -> str:
    """Resident and read-per-token shares of fp32 against the claimed share: "holds" when the
    resident share is within 5 points of it; "partly" when only the bytes read per token are
    (a float table kept beside the quantized layers); else "not". Introduced in notebook 04."""
    if resident <= claimed + MEMORY_SLACK:
        return "holds"
    if read <= claimed + MEMORY_SLACK:
        return "partly: the bytes read per token are near the claim, the resident bytes are not"
    return "not: more than claimed"


def speed_claim_verdict(ratio: float, claimed: float) -> str:
    """A decode ratio to fp32 against the claimed one: "holds" from 80% of it, "partly" from
    1.05x, else "not". Introduced in notebook 04 (quantization)."""
    if ratio >= 0.8 * claimed:
        return "holds"
    if ratio >= 1.05:
        return "partly: faster, but less than claimed"
    return "not: no faster than fp32 here"


def quality_verdict(perplexity_increase: float, claimed: str) -> str:
    """The measured loss (`loss_of`) against the claimed one: "holds" when it is no larger
    (saying so when it is smaller), else "not". Introduced in notebook 04 (quantization)."""
    measured = loss_of(perplexity_increase)
    if LOSSES.index(measured) < LOSSES.index(claimed):
        return f"holds (less loss than claimed: {measured})"
    if measured == claimed:
        return "holds"
    return f"not: a {measured} loss, more than claimed"


def _speed_text(row: dict) -> str:
    vs_bf16 = row.get("speed_vs_bf16")
    return (f"{row['speed_vs_fp32']:.2f}x fp32" + (f", {vs_bf16:.2f}x bf16" if vs_bf16 is not None else "")
            + (f" ({row['kernel']})" if row.get("kernel") else ""))


def quantization_claims(rows: dict[str, dict], load: float | None = None) -> list[dict]:
    """The chapter's quantization table set against this run, one row per claim and format.

    Introduced in notebook 04 (quantization). rows: {name ("fp32", "bf16", "int8",
    "int4 g32", "bnb nf4", ...): measurements}, each with resident_fraction and
    read_fraction (of fp32's bytes), speed_vs_fp32 (None: not timed), optional
    speed_vs_bf16, kernel, and timing (the per-step samples, a `measure.Timing` or its
    dict), perplexity and top1. "fp32" carries the reference timing and perplexity.
    load: the load probe taken with the timings (`busy.load_per_core`), or None.
    Returns dicts with topic, weights, claim, measured and verdict; the thresholds are
    those of `memory_verdict`, `speed_claim_verdict` and `quality_verdict`.
    """
    fp32 = rows["fp32"]
    claims = []
    for name, row in rows.items():
        key = chapter_format(name)
        if key is None:
            continue
        memory, speed, loss = CHAPTER_FIGURES[key]
        claims.append({"topic": "memory", "weights": name, "claim": f"{memory:.1%} of fp32",
                       "measured": f"{row['resident_fraction']:.1%} resident, {row['read_fraction']:.1%} "
                                   "read per token",
                       "verdict": memory_verdict(row["resident_fraction"], row["read_fraction"], memory)})
        if row.get("speed_vs_fp32") is None:
            claims.append({"topic": "decode speed", "weights": name, "claim": f"~{speed:g}x fp32",
                           "measured": row.get("speed_note") or "not timed in this run",
                           "verdict": "not timed here"})
        else:
            reason = busy_reason({"fp32": fp32["timing"], name: row["timing"]}, load=load) \
                if row.get("timing") is not None and fp32.get("timing") is not None else None
            claims.append({"topic": "decode speed", "weights": name, "claim": f"~{speed:g}x fp32",
                           "measured": _speed_text(row),
                           "verdict": judge(speed_claim_verdict(row["speed_vs_fp32"], speed), reason)})
        increase = row["perplexity"] / fp32["perplexity"] - 1
        claims.append({"topic": "quality", "weights": name, "claim": f"{loss} loss",
                       "measured": f"perplexity {increase:+.1%} over fp32, top-1 token as fp32's at "
                                   f"{row['top1']:.0%} of the positions",
                       "verdict": quality_verdict(increase, loss) if math.isfinite(increase) else "not measured here"})
    return claims


def quantization_conclusions(claims: list[dict]) -> str:
    """The claims table of `quantization_claims` in sentences built from its verdicts
    (Markdown bullets, one per topic). Introduced in notebook 04 (quantization)."""
    return summarize_verdicts(claims, name_key="weights")


def quantization_section_claims(section: dict) -> list[dict]:
    """The quantization bench section's claims: `quantization_claims` of its ``rows`` (those
    that ran; a row with an ``error`` was not made here), under the names that function reads,
    with the suite's ``load_per_core``. Introduced in notebook 04 (quantization)."""
    rows = {name: {"resident_fraction": row["resident_fraction"], "read_fraction": row["memory_fraction"],
                   "speed_vs_fp32": row.get("decode_speedup"), "speed_vs_bf16": row.get("decode_speedup_bf16"),
                   "kernel": row.get("kernel"), "timing": row.get("timing"), "speed_note": row.get("speed_note"),
                   "perplexity": row["perplexity"], "top1": row["top1_agreement"]}
            for name, row in section["rows"].items() if "error" not in row}
    return quantization_claims(rows, load=section.get("load_per_core"))
