"""Checkers for notebook 03 (mixed precision).

Introduced in notebook 03 (mixed precision). Each compares a learner's answer
with `labsupport.precision` and either confirms it or raises `CheckFailed` with
what was expected, what came back, and a hint.
"""

from __future__ import annotations

import torch

from ..hardware import dtype_name
from ..models.config import PRESETS
from ..precision import MIB, first_square_overflow, footprint_mib
from . import close_enough, fail, passed

# (config, dtype): GPT-2 gives the handbook chapter's 474.7 / 237.4; the others make
# sure the answer follows the config and the dtype rather than a remembered number.
FOOTPRINT_CASES = (
    (PRESETS["gpt2"], torch.float32),
    (PRESETS["gpt2"], torch.float16),
    (PRESETS["smollm2-135m"], torch.bfloat16),
    (PRESETS["smollm2-135m"], torch.float32),
    (PRESETS["llama-7b-shape"], torch.float16),
)


def _footprint_hint(config, dtype, got: float) -> str:
    """Guess the usual slip behind a wrong footprint."""
    expected_bytes = footprint_mib(config, dtype) * MIB
    size = dtype.itemsize
    name = dtype_name(dtype)
    if close_enough(got, expected_bytes / 1e6, 1e-3):
        return ("that is MB (10^6 bytes). The handbook chapter's 'MB' are MiB: divide the bytes "
                "by 2**20 = 1,048,576.")
    if close_enough(got, expected_bytes, 1e-3):
        return "that is bytes; divide by 2**20 for MiB."
    if close_enough(got, config.num_parameters / MIB, 1e-3):
        return f"multiply the parameter count by the bytes per value ({size} for {name}: dtype.itemsize)."
    if close_enough(got, 8 * expected_bytes / MIB, 1e-3):
        return f"that counts bits; a {name} value takes {size} bytes ({8 * size} bits)."
    for other in (1, 2, 4, 8):
        if other != size and close_enough(got, config.num_parameters * other / MIB, 1e-3):
            return (f"you used {other} bytes per value; {name} takes {size} "
                    "(float32: 4; float16 and bfloat16: 2; `dtype.itemsize` says it).")
    return ("footprint = config.num_parameters x bytes per value (dtype.itemsize) / 2**20, "
            "the parameters counted once even when the embedding is tied to the output layer.")


def check_footprint(fn) -> None:
    """Check a learner's `fn(config, dtype) -> MiB` (weights in MiB when stored in dtype).

    Introduced in notebook 03 (mixed precision). Compared with `precision.footprint_mib`
    on GPT-2, SmolLM2-135M and a 7B Llama shape in fp32, fp16 and bf16, within 0.05%.
    """
    exercise = "model footprint per precision"
    for config, dtype in FOOTPRINT_CASES:
        case = f"{config.name} in {dtype_name(dtype)}"
        expected = footprint_mib(config, dtype)
        answer = fn(config, dtype)
        try:
            got = float(answer)
        except (TypeError, ValueError):
            fail(f"{exercise} ({case})", "a number of MiB", repr(answer)[:80],
                 "end the function with: return mib (a float)")
        if not close_enough(got, expected, 5e-4):
            fail(f"{exercise} ({case})", f"{expected:.1f} MiB", f"{got:.6g}", _footprint_hint(config, dtype, got))
    gpt2 = PRESETS["gpt2"]
    passed(exercise, f"GPT-2: {fn(gpt2, torch.float32):.1f} MiB in fp32, {fn(gpt2, torch.float16):.1f} MiB "
                     f"in fp16, as the handbook chapter says (in MiB); checked on {len(FOOTPRINT_CASES)} cases.")


def _overflow_cases() -> list[torch.Tensor]:
    """Activation vectors where the answer is clear: none is within 0.5 of 256 in size
    (there, computing the square in fp16 or in fp32 and comparing could disagree)."""
    generator = torch.Generator().manual_seed(3)
    cases = [torch.tensor([1.0, 100.0, 255.0, 300.0, 20.0]),          # 3
             torch.tensor([-300.0, 5.0, 400.0]),                       # 0: negative values square too
             torch.tensor([0.5, -2.0, 3.0, 250.0]),                    # None
             torch.tensor([10.0, 70000.0, 1.0])]                       # 1: too big even unsquared
    for outlier_at in (57, 0, None):
        values = torch.randn(128, generator=generator) * 40               # typical activations
        values = torch.where((values.abs() - 256).abs() < 0.5, values / 2, values)
        if outlier_at is not None:
            values[outlier_at] = -512.0 if outlier_at % 2 else 900.0
        cases.append(values)
    return cases


def _overflow_hint(values: torch.Tensor, got) -> str:
    """Guess the usual slip behind a wrong overflow index."""
    expected = first_square_overflow(values)
    unsquared = (values.abs() > 65504).nonzero()
    positive_only = (values > 256).nonzero()
    if expected is None and got == -1:
        return "when nothing overflows, return None rather than -1."
    if expected is not None and got == expected + 1:
        return "Python counts from 0: return the index itself, not index + 1."
    if len(unsquared) and got == int(unsquared[0, 0]) or (got is None and not len(unsquared)):
        return "compare the square of each value with 65504, not the value itself."
    if len(positive_only) and got == int(positive_only[0, 0]):
        return "a negative activation squares to a positive number: compare |x| or x * x."
    return ("square each value (x * x), compare with torch.finfo(torch.float16).max = 65504, and "
            "return the index of the first that is larger, or None.")


def check_first_overflow(fn) -> None:
    """Check a learner's `fn(values) -> index or None`: the index of the first value whose
    square is larger than fp16's largest number (65504).

    Introduced in notebook 03 (mixed precision). Compared with
    `precision.first_square_overflow` on hand-made and random activation vectors.
    """
    exercise = "first fp16 overflow of a square"
    cases = _overflow_cases()
    for number, values in enumerate(cases, 1):
        expected = first_square_overflow(values)
        answer = fn(values.clone())
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            answer = answer.item()
        if answer is not None and not isinstance(answer, int):
            try:
                answer = int(answer)
            except (TypeError, ValueError):
                fail(exercise, "an index (int) or None", repr(answer)[:80], "return an int such as 3, or None")
        if answer != expected:
            shown = values[:6].tolist()
            fail(f"{exercise} (case {number}: {len(values)} values starting {[round(v, 1) for v in shown]})",
                 expected, answer, _overflow_hint(values, answer))
    passed(exercise, f"Checked on {len(cases)} activation vectors.")
