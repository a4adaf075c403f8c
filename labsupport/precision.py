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

import copy

import torch

from .errors import LabError
from .hardware import bf16_supported, check_dtype
from .models.layout import apply_layout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP16_MAX = torch.finfo(torch.float16).max           # 65504


def as_dtype(name_or_dtype) -> torch.dtype:
    """torch.float32 / "float32" / "fp32" / "bf16" ... -> a torch dtype."""
    if isinstance(name_or_dtype, torch.dtype):
        return name_or_dtype
    aliases = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
    name = aliases.get(str(name_or_dtype), str(name_or_dtype)).removeprefix("torch.")
    if name not in DTYPES:
        raise LabError(f"Unknown precision {name_or_dtype!r}; use one of {', '.join(DTYPES)}.")
    return DTYPES[name]


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer of `model`, shared tensors counted once."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.nbytes
    return total


def parameter_bytes(num_parameters: int, dtype) -> int:
    """The footprint of `num_parameters` weights stored in `dtype`."""
    return num_parameters * torch.empty((), dtype=as_dtype(dtype)).element_size()


def cast_model(model: torch.nn.Module, dtype) -> torch.nn.Module:
    """A copy of `model` with its weights in `dtype` (the original is untouched),
    laid out for the fastest kernel on its device (see models/layout.py)."""
    dtype = as_dtype(dtype)
    check_dtype(model.device, dtype)
    copy_ = copy.deepcopy(model).to(dtype)
    apply_layout(copy_)
    return copy_


@torch.inference_mode()
def logit_agreement(reference, other, tokens: torch.Tensor) -> dict:
    """How far `other`'s logits are from `reference`'s on the same tokens (batch, T):
    max and mean absolute difference, and how often the top-1 token agrees."""
    ref = reference(tokens).float()
    out = other(tokens.to(other.device)).float().to(ref.device)
    diff = (ref - out).abs()
    return {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
            "top1_agreement": (ref.argmax(-1) == out.argmax(-1)).float().mean().item()}


@torch.inference_mode()
def autocast_logits(model, tokens: torch.Tensor, dtype) -> torch.Tensor:
    """Logits with fp32 weights under torch.autocast: matmuls run in `dtype`, while
    numerically sensitive ops (softmax, norms) stay in fp32. Compare with `cast_model`,
    which stores the weights themselves in `dtype` (half the memory, and the only one
    of the two that halves the bytes a decode step reads)."""
    with torch.autocast(device_type=model.device.type, dtype=as_dtype(dtype)):
        return model(tokens).float()


def overflow_demo(values=(100.0, 255.0, 256.0, 300.0)) -> list[dict]:
    """Square a few activations-sized numbers in fp32, fp16 and bf16: fp16 overflows to
    inf once the result passes 65504, bf16 does not (but rounds coarsely)."""
    rows = []
    for v in values:
        row = {"x": v, "x*x (fp32)": v * v}
        for name in ("float16", "bfloat16"):
            x = torch.tensor(v, dtype=DTYPES[name])
            row[f"x*x ({name})"] = (x * x).item()
        rows.append(row)
    return rows


def first_overflow(values: torch.Tensor) -> int | None:
    """Index of the first value that is finite in fp32 but not in fp16 (None if none)."""
    bad = torch.isfinite(values.float()) & ~torch.isfinite(values.float().to(torch.float16))
    indices = bad.nonzero()
    return int(indices[0, 0]) if len(indices) else None


def bf16_report(device) -> dict:
    """Whether bf16 really runs in hardware here, beside what the framework answers.

    On a GPU, `torch.cuda.is_bf16_supported()` can answer True on a T4 (compute
    capability 7.5), where bf16 is emulated and slow; the capability (>= 8.0) is
    the real test. On a CPU, the instructions (AVX512-BF16, AMX) are.
    """
    device = torch.device(device)
    framework = None
    if device.type == "cuda":
        framework = bool(torch.cuda.is_bf16_supported())
    elif device.type == "cpu":
        framework = True                     # the CPU always runs bf16, emulated if need be
    return {"device": str(device), "framework_says": framework, "hardware_has": bf16_supported(device)}


# --- measuring it (notebook 03; `python -m labsupport bench --sections precision`) --------

def section_precision(ctx, options: dict) -> dict:
    """Memory per dtype; fp32 against 16-bit in decode (batch 1) and prefill; agreement."""
    from .bench import figure
    from .generate import generate, prefill
    from .hardware import fp16_fast
    from .kv_cache import StaticKVCache
    from .measure import time_side_by_side
    from .models.config import PRESETS

    model, tok = ctx.model(torch.float32)
    half = [torch.bfloat16] if bf16_supported(ctx.device) else []
    if ctx.device.type == "cuda" or fp16_fast(ctx.device):
        half.append(torch.float16)
    models = {"float32": model, **{str(d).removeprefix("torch."): cast_model(model, d) for d in half}}

    gpt2 = PRESETS["gpt2"].num_parameters
    memory = {name: tensor_bytes(m) for name, m in models.items()}
    figures = [figure("GPT-2 weights in fp32 / fp16 (counted from its config)",
                      parameter_bytes(gpt2, "float16") / parameter_bytes(gpt2, "float32"), "fraction",
                      claim="474.7 MB -> 237.4 MB (50% less)",
                      note=f"{gpt2:,} parameters: {parameter_bytes(gpt2, 'float32') / 2**20:.1f} MiB fp32, "
                           f"{parameter_bytes(gpt2, 'float16') / 2**20:.1f} MiB fp16")]

    ids = tok.encode("The history of the lighthouse begins with fires lit on hills by the sea.")
    new_tokens = options.get("precision_new_tokens", 32)
    long_prompt = (ids * 64)[: options.get("prefill_tokens", 512)]

    def decode(m):
        return lambda: generate(m, ids, new_tokens, eos_token_ids=())

    def prefill_once(m):
        def run():
            cache = StaticKVCache(m.config, 1, len(long_prompt), device=m.device, dtype=m.dtype)
            prefill(m, torch.tensor([long_prompt], device=m.device), cache)
        return run

    repeats = options.get("repeats", 3)
    decode_t = time_side_by_side({n: decode(m) for n, m in models.items()}, ctx.device, repeats=repeats)
    prefill_t = time_side_by_side({n: prefill_once(m) for n, m in models.items()}, ctx.device, repeats=repeats)
    probe_tokens = torch.tensor([long_prompt[:128]], device=ctx.device)
    rows = {}
    for name, m in models.items():
        rows[name] = {"bytes": memory[name],
                      "decode_speedup": decode_t["float32"].median / decode_t[name].median,
                      "prefill_speedup": prefill_t["float32"].median / prefill_t[name].median,
                      **(logit_agreement(model, m, probe_tokens) if name != "float32" else {})}
        if name != "float32":
            figures += [
                figure(f"{name} / fp32 decode speed (batch 1)", rows[name]["decode_speedup"], "x",
                       claim="fp16 ~1.5x", note=f"{new_tokens} new tokens"),
                figure(f"{name} / fp32 prefill speed ({len(long_prompt)}-token prompt)",
                       rows[name]["prefill_speedup"], "x"),
                figure(f"{name} top-1 agreement with fp32", rows[name]["top1_agreement"], "fraction",
                       claim="fp16: minimal loss",
                       note=f"max |logit difference| {rows[name]['max_abs_diff']:.3f}"),
            ]
    return {"models": rows, "memory_bytes": memory, "bf16": bf16_report(ctx.device),
            "timings_s": {"decode": {k: v.to_dict() for k, v in decode_t.items()},
                          "prefill": {k: v.to_dict() for k, v in prefill_t.items()}},
            "figures": figures}
