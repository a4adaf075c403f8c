"""The handbook chapter's claims of notebook 04 (quantization), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested."""

from __future__ import annotations


QUANTIZATION_CLAIMS = {  # the handbook chapter's claims: (memory, speed), per format
    "fp16": ("50% of fp32", "~1.5x"), "bf16": ("50% of fp32", "~1.5x (as fp16)"),
    "int8": ("25% of fp32", "~2x"), "int4": ("12.5% of fp32", "~3x"),
}


def quantization_claim(row: str, which: int) -> str | None:
    """The chapter's claim for one row of the quantization benchmark (`bench.quantization`):
    its memory (which=0) or its speed (which=1), None where the chapter makes none.

    Introduced in notebook 04 (quantization). int4 rows and bitsandbytes NF4 share int4's
    claims, bitsandbytes int8 shares int8's.
    """
    key = "int4" if row.startswith("int4") else "int8" if row.endswith("int8") else row
    key = "int4" if row == "bnb nf4" else key
    return QUANTIZATION_CLAIMS[key][which] if key in QUANTIZATION_CLAIMS else None
