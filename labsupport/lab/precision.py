"""Mixed precision: what fp16 and bf16 save, when they are faster, what they break.

Introduced in notebook 03 (mixed precision).

* Memory: 2 bytes per weight instead of 4, counted from the actual tensors.
* Speed: a memory-bound decode step reads half the bytes; a compute-bound
  prefill runs on the device's 16-bit matrix units where it has them (tensor
  cores on a GPU; AVX512-BF16 or AMX on recent CPUs). Which regime gains how
  much depends on the hardware, so it is measured.
* Numerics: fp16 keeps 10 mantissa bits but overflows above 65504; bf16 keeps
  fp32's range with only 7 mantissa bits. Logit differences and top-1 agreement
  with fp32 say what that costs on a real model.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import LabError
from ..engine.hardware import as_dtype, bf16_emulated, bf16_supported, dtype_label, dtype_name, fp16_fast, pick_device
from .quality import logit_summary

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP16_MAX = torch.finfo(torch.float16).max           # 65504
MIB = 2**20                                          # the handbook chapter's "MB" are MiB
# The handbook chapter's GPT-2 figures, in MiB (it writes "MB").
CHAPTER_GPT2_MIB = {"float32": 474.7, "float16": 237.4}



def parameter_bytes(num_parameters: int, dtype) -> int:
    """The footprint of `num_parameters` weights stored in `dtype`. Notebook 03 (mixed precision)."""
    return num_parameters * torch.empty((), dtype=as_dtype(dtype)).element_size()


def footprint_mib(config, dtype) -> float:
    """A model's weights in MiB (2**20 bytes) when stored in `dtype`, from its config's
    parameter count: the reference for notebook 03's first exercise."""
    return parameter_bytes(config.num_parameters, dtype) / MIB


def table_parameters(config) -> int:
    """Parameters of the lookup tables and the output layer: the token embedding
    (vocab x hidden), GPT-2's learned position table (max_position x hidden), and the
    output layer (vocab x hidden) unless it is tied to the embedding (then it is the
    same tensor, counted once). Introduced in notebook 03 (mixed precision)."""
    tables = config.vocab_size * config.hidden_size                         # token embedding
    if config.family == "gpt2":
        tables += config.max_position * config.hidden_size                   # learned positions
    if not config.tie_embeddings:
        tables += config.vocab_size * config.hidden_size                     # its own output layer
    return tables


def block_parameters(config) -> int:
    """Parameters of the transformer blocks and the final norm: everything `table_parameters`
    leaves out. Introduced in notebook 03 (mixed precision), given to its first exercise.
    Buffers (the RoPE tables of Llama-style models) are not parameters: they are
    recomputed from the config, and the handbook chapter's figures leave them out."""
    return config.num_parameters - table_parameters(config)



@torch.inference_mode()
def logit_agreement(reference, other, tokens: torch.Tensor) -> dict:
    """How far `other`'s logits are from `reference`'s on the same tokens (batch, T):
    max and mean absolute difference, and how often the top-1 token agrees. Notebook 03 (mixed precision)."""
    ref = reference.logits(reference(tokens)).float()
    other_tokens = tokens.to(other.device)
    out = other.logits(other(other_tokens)).float().to(ref.device)
    return logit_summary(ref, out)


@torch.inference_mode()
def logit_differences(reference_logits: torch.Tensor, other, tokens: torch.Tensor) -> dict:
    """`logit_agreement` against logits already computed (batch, T, vocab), plus every
    |difference| as a NumPy array (for a histogram). Introduced in notebook 03 (mixed precision)."""
    ref = reference_logits.float()
    other_tokens = tokens.to(other.device)
    out = other.logits(other(other_tokens)).float().to(ref.device)
    return {**logit_summary(ref, out), "abs_diff": (ref - out).abs().flatten().cpu().numpy()}


@torch.inference_mode()
def autocast_logits(model, tokens: torch.Tensor, dtype) -> torch.Tensor:
    """Logits with fp32 weights under torch.autocast: matmuls run in `dtype`, while
    numerically sensitive ops (softmax, norms) stay in fp32. Compare with `cast_model`,
    which stores the weights themselves in `dtype` (half the memory, and the only one
    of the two that halves the bytes a decode step reads). Notebook 03 (mixed precision)."""
    with torch.autocast(device_type=model.device.type, dtype=as_dtype(dtype)):
        return model.logits(model(tokens)).float()


def overflow_demo(values=(100.0, 255.0, 256.0, 300.0)) -> list[dict]:
    """Square a few activations-sized numbers in fp32, fp16 and bf16: fp16 overflows to
    inf once the result passes 65504, bf16 does not (but rounds coarsely). Notebook 03 (mixed precision)."""
    rows = []
    for v in values:
        row = {"x": v, "x*x (fp32)": v * v}
        for name in ("float16", "bfloat16"):
            x = torch.tensor(v, dtype=DTYPES[name])
            row[f"x*x ({name})"] = (x * x).item()
        rows.append(row)
    return rows


def first_overflow(values: torch.Tensor) -> int | None:
    """Index of the first value that is finite in fp32 but not in fp16 (None if none).
    Notebook 03 (mixed precision)."""
    bad = torch.isfinite(values.float()) & ~torch.isfinite(values.float().to(torch.float16))
    indices = bad.nonzero()
    return int(indices[0, 0]) if len(indices) else None


def first_square_overflow(values) -> int | None:
    """Index of the first value whose square is larger than fp16 can hold (65504), or None.

    Introduced in notebook 03 (mixed precision): the reference for its second exercise.
    A norm layer squares every activation (RMSNorm: mean of x**2), so an activation
    above 255.9 in size, harmless in itself, overflows there if computed in fp16.
    """
    squares = torch.as_tensor(values, dtype=torch.float64).flatten() ** 2
    indices = (squares > FP16_MAX).nonzero()
    return int(indices[0, 0]) if len(indices) else None


def spacing(value: float, dtype) -> float:
    """The gap between |value| and the next larger number `dtype` can store: how finely a
    value of that size is kept (22000 in bf16: 128; in fp16: 16). Notebook 03 (mixed precision)."""
    dtype = as_dtype(dtype)
    x = torch.tensor(abs(float(value)), dtype=torch.float64).to(dtype)
    above = torch.nextafter(x, torch.tensor(math.inf, dtype=dtype))
    return (above.double() - x.double()).item()


def matmul_accumulate(a: torch.Tensor, b: torch.Tensor, accumulate_dtype) -> torch.Tensor:
    """a @ b with the products added one k at a time into a running sum kept in
    `accumulate_dtype`, the result rounded to a's dtype at the end.

    Introduced in notebook 03 (mixed precision): the reference for its third exercise.
    a (M, K) and b (K, N) share one float dtype (fp16 or bf16). Tensor cores and the
    CPU's bf16 kernels multiply 16-bit inputs but accumulate in fp32
    (accumulate_dtype=torch.float32: each product of two 16-bit numbers is exact in
    fp32); a 16-bit running sum (accumulate_dtype=a.dtype) stops growing once each
    product is below half its step: 1024 ones sum to 256 in bf16.
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim() == 2
            and a.shape[1] == b.shape[0] and a.dtype == b.dtype and a.is_floating_point()):
        raise LabError("matmul_accumulate takes two float matrices of one dtype, a (M, K) and b (K, N).")
    accumulate_dtype = as_dtype(accumulate_dtype)
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype, device=a.device)     # (M, N)
    for k in range(a.shape[1]):
        # column k of a times row k of b: (M, 1) * (1, N) -> (M, N), then one rounding per addition
        total = total + a[:, k, None].to(accumulate_dtype) * b[None, k, :].to(accumulate_dtype)
    return total.to(a.dtype)


def squares_by_dtype(xs) -> dict[str, list[float]]:
    """x*x computed in fp32, fp16 and bf16 for each x (x first rounded to the dtype).
    Introduced in notebook 03 (mixed precision), for `plots.precision.overflow_figure`."""
    x64 = torch.as_tensor(xs, dtype=torch.float64)
    result = {"x": x64.tolist(), "exact": (x64 * x64).tolist()}
    for name, dtype in DTYPES.items():
        x = x64.to(dtype)
        result[name] = (x * x).double().tolist()
    return result


def format_bits(dtype) -> dict:
    """Sign, exponent and mantissa bits of a float dtype, with its range and step at 1.
    Introduced in notebook 03 (mixed precision)."""
    dtype = as_dtype(dtype)
    info = torch.finfo(dtype)
    mantissa = round(-math.log2(info.eps))          # eps = 2**-mantissa_bits: the step just above 1
    return {"dtype": dtype_name(dtype), "bits": info.bits,
            "exponent_bits": info.bits - 1 - mantissa, "mantissa_bits": mantissa,
            "max": info.max, "smallest_normal": info.tiny, "eps": info.eps}


def bf16_report(device) -> dict:
    """Whether bf16 really runs in hardware here, beside what the framework answers.

    On a GPU, `torch.cuda.is_bf16_supported()` can answer True on a T4 (compute
    capability 7.5), where bf16 is emulated and slow; the capability (>= 8.0) is
    the real test. On a CPU, the instructions (AVX512-BF16, AMX) are.

    Notebook 03 (mixed precision).
    """
    device = torch.device(device)
    framework = None
    if device.type == "cuda":
        framework = bool(torch.cuda.is_bf16_supported())
    elif device.type == "cpu":
        framework = True                     # the CPU always runs bf16, emulated if need be
    return {"device": str(device), "framework_says": framework, "hardware_has": bf16_supported(device)}


# Compute capability of GPUs a learner is likely to meet. bf16 arithmetic in hardware
# needs 8.0 (Ampere) or newer; the framework may still answer "supported" below that.
KNOWN_GPUS = {"V100": (7, 0), "T4 (Colab's free GPU)": (7, 5), "A100": (8, 0), "RTX 3090": (8, 6),
              "L4": (8, 9), "RTX 4090": (8, 9), "H100 / H200": (9, 0)}


def bf16_in_hardware(capability) -> bool:
    """True for a CUDA compute capability (major, minor) with bf16 units: 8.0 or newer.
    Notebook 03 (mixed precision)."""
    return tuple(capability) >= (8, 0)


# --- speed in two regimes (notebook 03's lab and explorer: `explorers.precision.PrecisionLab`) ---

REGIMES = ("decode", "prefill")


def regime_label(regime: str, workload) -> str:
    """ "decode" -> "decode, batch 1 (memory-bound)"; "prefill" -> "prefill, 256 tokens (compute-bound)".

    Introduced in notebook 03 (mixed precision). workload: anything with ``prefill_tokens``
    (a `workloads.PrecisionWorkload`)."""
    if regime == "decode":
        return "decode, batch 1 (memory-bound)"
    if regime == "prefill":
        return f"prefill, {workload.prefill_tokens} tokens (compute-bound)"
    raise LabError(f"Unknown regime {regime!r}; use one of {', '.join(REGIMES)}.")


def precision_choices(device) -> list[str]:
    """The dtypes a model can run in here: float32; bfloat16 where the hardware has it, and on
    every CPU (emulated where it has no bf16 instructions: same memory and logits, its own
    speed); float16. A GPU without bf16 units (a T4) gets no bfloat16. Notebook 03 (mixed precision)."""
    bf16 = bf16_supported(device) or bf16_emulated(device)
    return ["float32"] + (["bfloat16"] if bf16 else []) + ["float16"]


def emulation_note(device, dtype) -> str:
    """ "" or one phrase saying that `dtype` is emulated here (shown beside its speed).
    Notebook 03 (mixed precision)."""
    if dtype_label(device, dtype).endswith("(emulated)"):
        kind = "bf16 (AVX512-BF16 or AMX)" if as_dtype(dtype) == torch.bfloat16 else "fp16 (AMX-FP16)"
        return f"emulated: this CPU has no {kind} instructions"
    return ""


def speed_skip_reason(device, dtype, regime: str) -> str | None:
    """Why a timing is not worth running here, or None. A CPU without AMX-FP16 converts
    every fp16 value before multiplying, so a long fp16 prefill takes minutes.
    Notebook 03 (mixed precision)."""
    if as_dtype(dtype) == torch.float16 and regime == "prefill" and not fp16_fast(device):
        if pick_device(device).type == "cuda":
            return ("skipped: this GPU runs fp16 at 1/64 of its fp32 rate (compute capability 6.1), so a "
                    "long fp16 prefill would only measure that")
        return ("skipped: this CPU has no fp16 matrix instructions (AMX-FP16), so fp16 matmuls are "
                "emulated and a long prefill would take minutes")
    return None


def decode_run(model, prompt_ids, new_tokens: int) -> Callable[[], object]:
    """A zero-argument function: greedy generation of `new_tokens` at batch 1 (a short
    prompt's prefill, then one decode step per token). Introduced in notebook 03. On a GPU a
    replayed CUDA graph, else a LabError (`measure.timed_compile`, `measure.require_graphed`)."""
    from ..engine.generation import generate
    from .measure import require_graphed, timed_compile
    graphed = timed_compile(model.device)
    return lambda: require_graphed(generate(model, prompt_ids, new_tokens, eos_token_ids=(), compile=graphed),
                                   f"the {model.dtype} decode", model.device)


def prefill_run(model, prompt_ids) -> Callable[[], object]:
    """A zero-argument function: one prefill of the whole prompt into a fresh KV cache.
    Introduced in notebook 03 (mixed precision)."""
    from ..engine.generation import prefill
    from ..engine.kv_cache import StaticKVCache
    tokens = torch.tensor([list(prompt_ids)], device=model.device)          # (1, T)

    def run():
        cache = StaticKVCache(model.config, 1, tokens.shape[1], device=model.device, dtype=model.dtype)
        return prefill(model, tokens, cache)
    return run


def repeat_to_length(ids, length: int) -> list[int]:
    """`ids` repeated and cut to `length` tokens (a long prompt for timing a prefill).
    Notebook 03 (mixed precision)."""
    ids = list(ids)
    if not ids:
        raise LabError("Cannot build a prompt from no tokens; give at least one token id.")
    return (ids * (length // len(ids) + 1))[:length]
