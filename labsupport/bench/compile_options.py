"""The compile section's options (`compiled_decode.section_compile`, run only when named).

Introduced in notebook 07 (putting it together); ``python -m labsupport bench --sections compile``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import SectionOptions, count, counts, names, switch

COMPILE_ROWS = ("fp32", "bf16", "int8", "int4")


@dataclass(frozen=True)
class CompileOptions(SectionOptions):
    """The compile section's options. Introduced in notebook 07 (putting it together).

    rows: precisions timed eager against compiled, any of "fp32", "bf16", "int8", "int4"
    (the GPU preset: all four); batches: batch sizes timed; new_tokens: new tokens per timed
    generate(); repeats: timed repeats of each pair; inductor_variants: on a CPU, also time
    inductor's option variants (freezing, C++ wrapper, max-autotune)."""

    SECTION = "compile"
    rows: tuple[str, ...] = names(("fp32", "int4"), COMPILE_ROWS)
    batches: tuple[int, ...] = counts((1, 8))
    new_tokens: int = count(64)
    repeats: int = count(5)
    inductor_variants: bool = switch(True)

    @classmethod
    def gpu_sizes(cls) -> dict:
        return {"rows": COMPILE_ROWS}
