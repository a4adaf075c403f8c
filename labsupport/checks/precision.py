"""Checkers for notebook 03 (mixed precision).

Introduced in notebook 03 (mixed precision). Each compares a learner's answer
with `labsupport.lab.precision` and either confirms it or raises `CheckFailed` with
what was expected, what came back, and a hint. Each grades by reach (`grading.graded`):
its `Exercise` declares the quantity it teaches, and the package code that computes it
(the config's parameter counts among them) is refused.
"""

from __future__ import annotations

import math

import torch

from ..engine.hardware import dtype_name
from ..errors import first_line
from ..engine.config import PRESETS
from ..lab.precision import MIB, first_square_overflow, footprint_mib, matmul_accumulate
from . import close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded

ENGINE = "labsupport.engine."

# (config, dtype): GPT-2 gives the handbook chapter's 474.7 / 237.4 and has a position
# table; SmolLM2 ties its output layer and has RoPE buffers; the 7B Llama shape has its
# own output layer, and so does a GPT-2 variant: each slip of the count shows on one.
FOOTPRINT_CASES = (
    (PRESETS["gpt2"], torch.float32),
    (PRESETS["gpt2"], torch.float16),
    (PRESETS["smollm2-135m"], torch.bfloat16),
    (PRESETS["smollm2-135m"], torch.float32),
    (PRESETS["llama-7b-shape"], torch.float16),
    (PRESETS["gpt2"].with_(tie_embeddings=False, name="gpt2 with its own output layer"), torch.float32),
)


def _footprint_slips(config, dtype) -> list[tuple[float, str]]:
    """(the MiB a usual slip gives, the hint that names it), for one config and dtype."""
    size, name = dtype.itemsize, dtype_name(dtype)
    expected = footprint_mib(config, dtype)
    table = config.vocab_size * config.hidden_size * size / MIB           # one vocab x hidden matrix
    slips = [(expected * MIB / 1e6, "that is MB (10^6 bytes). The handbook chapter's 'MB' are MiB: divide the "
                                    "bytes by 2**20 = 1,048,576."),
             (expected * MIB, "that is bytes; divide by 2**20 for MiB."),
             (config.num_parameters / MIB, f"multiply the parameter count by the bytes per value ({size} for "
                                           f"{name}: dtype.itemsize)."),
             (8 * expected, f"that counts bits; a {name} value takes {size} bytes ({8 * size} bits).")]
    slips += [(config.num_parameters * other / MIB, f"you used {other} bytes per value; {name} takes {size} "
                                                    "(float32: 4; float16 and bfloat16: 2; `dtype.itemsize` says it).")
              for other in (1, 2, 4, 8) if other != size]
    if config.family == "gpt2":
        slips.append((expected - config.max_position * config.hidden_size * size / MIB,
                      "GPT-2's learned position table is missing: it adds max_position x hidden_size "
                      "parameters (1024 x 768 for GPT-2)."))
    else:
        rope = 2 * config.max_position * config.head_dim * size / MIB
        slips.append((expected + rope, "that counts the RoPE tables (cos and sin, max_position x head_dim each): "
                                       "they are buffers recomputed from the config, not weights."))
    if config.tie_embeddings:
        slips.append((expected + table, "the output layer is tied to the token embedding here "
                                        "(config.tie_embeddings): one matrix, counted once."))
    else:
        slips.append((expected - table, "this model has its own output layer (config.tie_embeddings is False): "
                                        "add its vocab_size x hidden_size parameters."))
        slips.append((expected - 2 * table, "no vocab x hidden matrix counted: add the token embedding and, "
                                            "since it is not tied, the output layer."))
    return slips


def _footprint_hint(config, dtype, got: float) -> str:
    """The slip behind a wrong footprint, when it is one of the usual ones."""
    for value, hint in _footprint_slips(config, dtype):
        if close_enough(got, value, 1e-4):
            return hint
    expected = footprint_mib(config, dtype)
    if got in (round(expected, 1), round(expected, 2)):
        return "return the MiB as computed, not a rounded figure: the checker tries other models and dtypes too."
    off = round((got - expected) * MIB / dtype.itemsize)
    if abs(off) < 0.01 * config.num_parameters:
        return (f"the count is off by {off:+,} parameters: count every norm and bias (an RMSNorm has h weights, a "
                "LayerNorm h weights and h biases, each GPT-2 projection a bias), the final norm included.")
    return ("parameters = every block's projections, MLP, norms and biases + the final norm + the token embedding "
            "+ GPT-2's position table + an untied output layer; MiB = parameters x dtype.itemsize / 2**20.")


FOOTPRINT = Exercise(
    "model footprint per precision",
    "a model's weights in MiB in one precision, every parameter counted from the config's shapes",
    # the config's counts; a model built from the config holds the parameters, and counts their bytes
    computed_by=tuple(ENGINE + path for path in (
        "config.ModelConfig.num_parameters", "config.ModelConfig.params_read_per_step",
        "config.ModelConfig.matmul_params", "precision.tensor_bytes", "models.transformer.Transformer",
        "models.transformer.Transformer.weight_bytes")) + ("labsupport.weights.fixtures.random_model",),
    receives=(ENGINE + "config.ModelConfig",),
    allowed=(ENGINE + "config.ModelConfig.head_dim",))           # a field of the shape: the heads' width


@grades_quietly
@graded(FOOTPRINT)
def check_footprint(fn) -> None:
    """Check a learner's `fn(config, dtype) -> MiB` (weights in MiB when stored in dtype).

    Introduced in notebook 03 (mixed precision). Compared with `precision.footprint_mib`, exactly
    (a count: every norm and bias included, to within float rounding) on GPT-2 (learned positions,
    tied output layer), SmolLM2-135M (tied, RoPE buffers that are not weights), a 7B Llama shape
    and a GPT-2 with its own output layer, in fp32, fp16 and bf16; each usual slip gets a hint
    that names it. Graded by reach (`FOOTPRINT`): the config's parameter counts are refused.
    """
    exercise = FOOTPRINT.title
    for config, dtype in FOOTPRINT_CASES:
        case = f"{config.name} in {dtype_name(dtype)}"
        expected = footprint_mib(config, dtype)
        answer = fn(config, dtype)
        try:
            got = float(answer)
        except (TypeError, ValueError):
            fail(f"{exercise} ({case})", "a number of MiB", repr(answer)[:80],
                 "end the function with: return mib (a float)")
        if not close_enough(got, expected, 1e-9):                 # a count: float rounding only (a parameter of GPT-2: 8e-9)
            fail(f"{exercise} ({case})", f"{expected:.4f} MiB", f"{got:.10g}", _footprint_hint(config, dtype, got))
    gpt2 = PRESETS["gpt2"]
    passed(exercise, f"GPT-2: {fn(gpt2, torch.float32):.1f} MiB in fp32, {fn(gpt2, torch.float16):.1f} MiB "
                     f"in fp16, as the handbook chapter says (in MiB); checked on {len(FOOTPRINT_CASES)} cases.")


def _overflow_cases() -> list[torch.Tensor]:
    """Activation vectors: the random ones keep 0.5 away from 256 in size; the last three sit on the boundary,
    sqrt(65504) = 255.9375 - 7.6e-6, on both sides of it and exactly on it (a float64 whose square is 65504.0,
    not larger). None is 255.9375 itself, which fp16 rounds up to 256 (computing the square in fp16 would then
    disagree with the exact square)."""
    generator = torch.Generator().manual_seed(3)
    cases = [torch.tensor([1.0, 100.0, 255.0, 300.0, 20.0]),          # 3
             torch.tensor([1.0, 300.0, 5.0, 400.0]),                   # 1: the first of two, not the last
             torch.tensor([-300.0, 5.0, 400.0]),                       # 0: negative values square too
             torch.tensor([0.5, -2.0, 3.0, 250.0]),                    # None
             torch.tensor([10.0, 70000.0, 1.0])]                       # 1: too big even unsquared
    for outlier_at in (57, 0, None):
        values = torch.randn(128, generator=generator) * 40               # typical activations
        values = torch.where((values.abs() - 256).abs() < 0.5, values / 2, values)
        if outlier_at is not None:
            values[outlier_at] = -512.0 if outlier_at % 2 else 900.0
        cases.append(values)
    return cases + [torch.tensor([255.93, 10.0, 255.95, 256.0, -300.0]),         # 2: 255.95^2 = 65510 > 65504
                    torch.tensor([-255.94, 3.0]),                               # 0: negative, just past it
                    torch.tensor([math.sqrt(65504.0), 256.0], dtype=torch.float64)]   # 1: 65504.0 is not larger


def _first_index(mask: torch.Tensor) -> int | None:
    hits = mask.nonzero().flatten().tolist()
    return hits[0] if hits else None


def _overflow_hint(values: torch.Tensor, got) -> str:
    """The usual slip behind a wrong overflow index, when it is one of them."""
    expected = first_square_overflow(values)
    squares = values.double() ** 2
    overflowing = (squares > 65504).nonzero().flatten().tolist()
    positive_only = (values > 256).nonzero().flatten().tolist()
    if expected is None and got == -1:
        return "when nothing overflows, return None rather than -1."
    if expected is None:
        return (f"no square here is above 65504 (the largest |value| is {values.abs().max():.1f}); "
                "return None. Square each value and compare the square, not the value.")
    if got is None:
        return (f"the value {values[expected]:.1f} at index {expected} squares to {squares[expected]:.0f}, "
                "above 65504: compare each square with fp16's largest number, torch.finfo(torch.float16).max "
                "(bf16's and fp32's are about 3.4e38, so nothing overflows against them).")
    if got in (_first_index(values.abs() > 256), _first_index(values.abs() >= 256)):
        return (f"compare each square with 65504, not |x| with 256: {values[expected]:.2f} squares to "
                f"{squares[expected]:.0f}, already past it (sqrt(65504) = 255.94).")
    if got == expected + 1:
        return "Python counts from 0: return the index itself, not index + 1."
    if positive_only and got == positive_only[0]:
        return "a negative activation squares to a positive number: compare |x| or x * x."
    if got == overflowing[-1]:
        return "that is the last value whose square overflows; return the first one (the smallest index)."
    if 0 <= got < len(values) and (values[got].abs() > 65504).item() and got != expected:
        return "compare the square of each value with 65504, not the value itself."
    if got == int(values[expected].item()) or got == int(squares[expected].item()):
        return f"return the index of the value (here {expected}), not the value or its square."
    return ("square each value (x * x), compare with torch.finfo(torch.float16).max = 65504, and "
            "return the index of the first that is larger, or None.")


FIRST_OVERFLOW = Exercise(
    "first fp16 overflow of a square",
    "the index of the first activation whose square is larger than fp16's largest number")   # lab code only


@grades_quietly
@graded(FIRST_OVERFLOW)
def check_first_overflow(fn) -> None:
    """Check a learner's `fn(values) -> index or None`: the index of the first value whose
    square is larger than fp16's largest number (65504).

    Introduced in notebook 03 (mixed precision). Compared with `precision.first_square_overflow`
    on hand-made and random activation vectors, and on the boundary (`_overflow_cases`).
    Graded by reach (`FIRST_OVERFLOW`).
    """
    exercise = FIRST_OVERFLOW.title
    cases = _overflow_cases()
    for number, values in enumerate(cases, 1):
        expected = first_square_overflow(values)
        answer = fn(values.clone())
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            answer = answer.item()
        if answer is not None and not isinstance(answer, int):
            try:
                answer = int(answer)
            except (TypeError, ValueError, RuntimeError):
                fail(exercise, "an index (int) or None", repr(answer)[:80],
                     "return one int, the first index (such as 3), or None; not a list of every index")
        if answer != expected:
            shown = values[:6].tolist()
            fail(f"{exercise} (case {number}: {len(values)} values starting {[round(v, 1) for v in shown]})",
                 expected, answer, _overflow_hint(values, answer))
    passed(exercise, f"Checked on {len(cases)} activation vectors.")


def _accumulation_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what the case shows, a (M, K), b (K, N)): where a 16-bit running sum and an fp32 one
    part ways, and where a product rounded to 16 bits before it is added shows."""
    generator = torch.Generator().manual_seed(33)
    cases = [("1024 ones in bf16", torch.ones(2, 1024, dtype=torch.bfloat16), torch.ones(1024, 3, dtype=torch.bfloat16)),
             ("3000 ones in fp16", torch.ones(1, 3000, dtype=torch.float16), torch.ones(3000, 2, dtype=torch.float16))]
    for dtype, step in ((torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10)):
        # (1 + step)^2 - (1 + 2 step) = step^2: exact only if each product is kept in full
        a = torch.tensor([[1 + step, 1.0], [1.0, 1 + step]], dtype=dtype)                     # (2, 2)
        b = torch.tensor([[1 + step, 1.0], [-(1 + 2 * step), 0.5]], dtype=dtype)              # (2, 2)
        cases.append((f"products that cancel in {dtype_name(dtype)}", a, b))
    cases.append(("random positive values in bf16", torch.rand(3, 512, generator=generator).to(torch.bfloat16),
                  torch.rand(512, 5, generator=generator).to(torch.bfloat16)))
    cases.append(("random signed values in fp16", torch.randn(4, 256, generator=generator).to(torch.float16),
                  torch.randn(256, 3, generator=generator).to(torch.float16)))
    return cases


def _accumulation_hint(a, b, accumulate, got: torch.Tensor) -> str:
    """The usual slip behind a wrong mixed-precision matmul, when it is one of them."""
    if accumulate != torch.float32 and torch.equal(got.float(), matmul_accumulate(a, b, torch.float32).float()):
        return (f"this is what an fp32 running sum gives; with accumulate_dtype={dtype_name(accumulate)} keep "
                f"the running sum in {dtype_name(accumulate)} (torch.zeros is float32 unless told, and a @ b or "
                ".sum() accumulate in fp32 inside PyTorch's kernels): add one product at a time in a loop over k.")
    if accumulate == torch.float32 and not torch.equal(got.float(), matmul_accumulate(a, b, torch.float32).float()):
        rounded_products = sum((a[:, k, None] * b[None, k, :]).float() for k in range(a.shape[1])).to(a.dtype)
        if torch.equal(got.float(), rounded_products.float()):
            return ("each product was rounded to 16 bits before it was added: convert a and b to float32 first, "
                    "so that every product is exact (a product of two 16-bit numbers fits in fp32).")
    return ("running sum in accumulate_dtype, starting from zeros (M, N); for k = 0 .. K-1 add "
            "a[:, k, None].to(acc) * b[None, k, :].to(acc); return the sum .to(a.dtype).")


ACCUMULATION = Exercise(
    "16-bit matmul with an fp32 or a 16-bit running sum",
    "a matmul whose products are added one k at a time into a running sum kept in the chosen dtype")   # lab code only


@grades_quietly
@graded(ACCUMULATION)
def check_accumulation(fn) -> None:
    """Check a learner's `fn(a, b, accumulate_dtype) -> a @ b`: 16-bit a (M, K) and b (K, N), the
    products added one k at a time into a running sum kept in `accumulate_dtype`, the result
    rounded to a's dtype.

    Introduced in notebook 03 (mixed precision). Compared with `precision.matmul_accumulate`
    for an fp32 and a 16-bit running sum: exactly on the sums of ones (where a 16-bit sum
    stalls) and, with an fp32 sum, on products that cancel (where a product rounded to 16
    bits shows); elsewhere within one 16-bit step for an fp32 sum (any order), within 1% of
    the sum of |products| for a 16-bit one (a fused multiply-add rounds once per step).
    Graded by reach (`ACCUMULATION`).
    """
    exercise = ACCUMULATION.title
    for what, a, b in _accumulation_cases():
        for accumulate in (torch.float32, a.dtype):
            case = f"{exercise} ({what}, a {tuple(a.shape)} @ b {tuple(b.shape)}, accumulate_dtype={dtype_name(accumulate)})"
            expected = matmul_accumulate(a, b, accumulate)
            try:
                got = fn(a.clone(), b.clone(), accumulate)
            except (RuntimeError, IndexError) as error:
                fail(case, f"a result of shape {tuple(expected.shape)}", f"an error ({first_line(error, limit=80)})",
                     "a is (M, K) and b is (K, N): multiply column k of a, a[:, k, None] (M, 1), by row k of b, "
                     "b[None, k, :] (1, N).")
            if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                fail(case, f"a tensor of shape {tuple(expected.shape)}",
                     f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__,
                     "the result has one value per row of a and column of b: (M, N).")
            if got.dtype != a.dtype:
                fail(case, f"a result in {dtype_name(a.dtype)} (a's dtype)", f"dtype {dtype_name(got.dtype)}",
                     "round the running sum to the inputs' dtype at the end: .to(a.dtype).")
            exact = what.startswith(("1024 ones", "3000 ones")) or (
                what.startswith("products that cancel") and accumulate == torch.float32)
            if accumulate == torch.float32:       # an fp32 sum in any order: within one 16-bit step
                above = torch.nextafter(expected.abs(), torch.tensor(float("inf"), dtype=a.dtype))
                allowed = above.float() - expected.abs().float()
            else:                                 # a 16-bit sum: 1% of the sum of |products| for another order
                allowed = 0.01 * (a.float().abs() @ b.float().abs())
            off = (got.float() - expected.float()).abs()
            if (exact and not torch.equal(got.float(), expected.float())) or (off > allowed).any():
                fail(case, f"values starting {expected.flatten()[:3].float().tolist()}",
                     f"{got.flatten()[:3].float().tolist()}", _accumulation_hint(a, b, accumulate, got))
    ones = torch.ones(1, 1024, dtype=torch.bfloat16)
    stalled = fn(ones, ones.t().contiguous(), torch.bfloat16).item()
    passed(exercise, f"1024 ones sum to {stalled:.0f} with a bf16 running sum and to "
                     f"{fn(ones, ones.t().contiguous(), torch.float32).item():.0f} with an fp32 one.")
