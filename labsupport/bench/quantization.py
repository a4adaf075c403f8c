"""Notebook 04's section: memory, decode speed and quality per method, side by side.

Introduced in notebook 04 (quantization); ``python -m labsupport bench --sections quantization``.

Rows: fp32, bf16, fp16, int8 (absmax, fast kernel), int4 groups of 32 and 128,
bitsandbytes LLM.int8() and NF4. One fp32 model is loaded; the 16-bit rows are
cast copies, and every quantized row is a `QuantizedHandle` on that same model,
swapped in only while it runs (``with handle:``), so no extra fp32 copy is held.

* memory: bytes resident in the model (`quality.resident_bytes`, the footprint
  the chapter's claim is about; with a tied output layer, quantizing it keeps the
  float embedding for lookups beside the quantized copy), and bytes a decode step
  reads (`quality.quantized_bytes`: the embedding is read one row per token);
* speed: decode tokens/s at batch 1 as a ratio to fp32, and to bf16 for the
  quantized rows (the fast int8/int4 kernels compute in bf16, so the ratio to bf16
  is what the smaller weights add), the rows interleaved in one run
  (`measure.time_side_by_side`); each ratio carries the busy reason of its two
  timings (`busy.busy_reason`); a row much slower than fp32 (bitsandbytes
  4-bit dequantizes in plain PyTorch on a CPU) is timed in its own pair with fp32
  on fewer tokens, and its note says so; fp16 is not timed where its matmuls are
  emulated (most CPUs);
* quality: perplexity on the shipped evaluation text, and the share of positions
  whose top-1 next token agrees with fp32. Where fp16 runs emulated, its quality is
  taken with fp16-rounded weights computed in fp32 (the rounding is what fp16
  storage costs; fp16 overflow in activations is notebook 03's subject).
"""

from __future__ import annotations

import copy
import math
from statistics import median as _median

import torch

from ..lab.busy import busy_reason
from ..claims import quantization_claim
from ..errors import LabError
from ..engine.generation import chat_prompt, generate
from ..engine.hardware import fp16_fast
from ..lab.measure import Timing, time_side_by_side
from ..engine.precision import cast_model
from ..lab.quality import eval_tokens, quantized_bytes, resident_bytes
from ..engine.quant import quantize_model
from ..lab.quality import _score
from .baseline import DEFAULT_PROMPT
from .core import BenchContext, reported
from .options import BenchOptions

# (row name, dtype for a cast copy, or (method, group size) for a quantized swap)
ROWS = [("fp32", torch.float32, None), ("bf16", torch.bfloat16, None), ("fp16", torch.float16, None),
        ("int8", None, ("int8", 32)), ("int4 g32", None, ("int4", 32)), ("int4 g128", None, ("int4", 128)),
        ("bnb int8", None, ("bnb-int8", 32)), ("bnb nf4", None, ("bnb-nf4", 32))]
TARGETS = {"int8": 2.0, "int4 g32": 2.5, "int4 g128": 2.5}


def _fp16_rounded(model):
    """fp32 model whose weights went through fp16 and back: fp16 storage's rounding, fp32 speed.
    Introduced in notebook 04 (quantization)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in rounded.parameters():
            tensor.copy_(tensor.half().float())
    return rounded


class _Nothing:
    """A context manager that does nothing (rows that need no swap). Introduced in notebook 04."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def section_quantization(ctx: BenchContext, options: BenchOptions) -> dict:
    """Memory, decode speed (ratio to fp32) and quality of each precision and quantization.

    Introduced in notebook 04 (quantization). Reads quant_new_tokens,
    quant_slow_new_tokens, quant_repeats and quant_eval_tokens.
    """
    model, tok = ctx.model(torch.float32)
    new_tokens = options.quant_new_tokens
    slow_tokens = options.quant_slow_new_tokens
    repeats = options.quant_repeats
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))
    eval_ids = eval_tokens(tok, max_tokens=options.quant_eval_tokens)
    fp16_runs = ctx.device.type == "cuda" or fp16_fast(ctx.device)

    # Build every row: a cast copy, or a handle on the fp32 model (restored until it runs).
    variants, rows = {}, {}
    for name, dtype, quant in ROWS:
        row = rows[name] = {"kind": "cast" if quant is None else quant[0]}
        try:
            if quant is None:
                variants[name] = (model if dtype == torch.float32 else cast_model(model, dtype), None)
            else:
                handle = quantize_model(model, quant[0], group_size=quant[1])
                handle.restore()
                variants[name] = (model, handle)
                row["kernels"] = handle.kernels
                row["kernel"] = handle.describe()
        except LabError as error:                  # e.g. bitsandbytes missing or not on this device
            row["error"] = str(error)

    def applied(name):
        m, handle = variants[name]
        return handle if handle is not None else _Nothing()

    # Memory and quality, one row at a time.
    fp32_nll, fp32_top1 = _score(model, eval_ids)
    fp32_bytes = model.weight_bytes()
    fp32_resident = resident_bytes(model)
    for name in variants:
        m, _ = variants[name]
        with applied(name):
            rows[name]["weight_bytes"] = quantized_bytes(m)
            rows[name]["tensor_bytes"] = resident_bytes(m)
            if name == "fp16" and not fp16_runs:
                scored, how = _fp16_rounded(model), "fp16-rounded weights computed in fp32"
            else:
                scored, how = m, "as run"
            nll, top1 = (fp32_nll, fp32_top1) if name == "fp32" else _score(scored, eval_ids)
        rows[name].update(memory_fraction=rows[name]["weight_bytes"] / fp32_bytes,
                          resident_fraction=rows[name]["tensor_bytes"] / fp32_resident, perplexity=math.exp(nll),
                          perplexity_increase=math.exp(nll) / math.exp(fp32_nll) - 1,
                          top1_agreement=(top1 == fp32_top1).float().mean().item(), quality_from=how)

    # Speed: decode tokens/s, all rows interleaved; very slow rows in a pair with fp32 on fewer tokens.
    decode_s: dict[str, list[float]] = {}

    def decode(name, tokens):
        m, _ = variants[name]

        def run():
            with applied(name):
                result = generate(m, ids, tokens, eos_token_ids=())
            decode_s.setdefault(f"{name}@{tokens}", []).append(result.decode_seconds / (tokens - 1))
        return run

    timed = [n for n in variants if n != "fp16" or fp16_runs]
    warm = {}
    for name in timed:                                             # warm-up, also sizes each row
        decode(name, new_tokens)()
        warm[name] = decode_s.pop(f"{name}@{new_tokens}")[0]
    fast_rows = [n for n in timed if warm[n] <= 5 * warm["fp32"]]
    slow_rows = [n for n in timed if n not in fast_rows]
    timings = time_side_by_side({n: decode(n, new_tokens) for n in fast_rows}, ctx.device,
                                warmup=0, repeats=repeats)
    for name in slow_rows:
        pair = time_side_by_side({"fp32": decode("fp32", slow_tokens), name: decode(name, slow_tokens)},
                                 ctx.device, warmup=0, repeats=1)
        timings[f"{name} (pair)"] = pair[name]
    for name in timed:
        tokens = new_tokens if name in fast_rows else slow_tokens
        step = _median(decode_s[f"{name}@{tokens}"])
        rows[name].update(decode_tokens_per_s=1 / step,
                          decode_speedup=_median(decode_s[f"fp32@{tokens}"]) / step,
                          timed_on_new_tokens=tokens,
                          bandwidth_bytes_per_s=rows[name]["weight_bytes"] / step,
                          bandwidth_fraction=rows[name]["weight_bytes"] / step / ctx.hardware.bandwidth,
                          busy=busy_reason({"fp32": Timing(decode_s[f"fp32@{tokens}"]),
                                            name: Timing(decode_s[f"{name}@{tokens}"])}))
        if "bf16" in fast_rows and name in fast_rows and rows[name]["kind"] in ("int8", "int4"):
            rows[name]["decode_speedup_bf16"] = _median(decode_s[f"bf16@{tokens}"]) / step
            rows[name]["busy_bf16"] = busy_reason({"bf16": Timing(decode_s[f"bf16@{tokens}"]),
                                                   name: Timing(decode_s[f"{name}@{tokens}"])})
    if "fp16" in rows and "fp16" not in timed:
        rows["fp16"]["decode_speedup"] = None
        rows["fp16"]["speed_note"] = "not timed: fp16 matmuls are emulated on this CPU (slow)"

    figures = []
    for name, row in rows.items():
        if name == "fp32" or "error" in row:
            if "error" in row:
                figures.append(reported(f"{name}: not run", float("nan"), "", note=row["error"]))
            continue
        figures.append(reported(f"{name} resident bytes / fp32", row["resident_fraction"], "fraction",
                                higher_is_better=False, claim=quantization_claim(name, 0),
                                note=f"{row['tensor_bytes'] / 2**20:.0f} MiB vs {fp32_resident / 2**20:.0f} MiB fp32 "
                                     "(every tensor the model holds, float lookup tables included)"))
        figures.append(reported(f"{name} bytes read per token / fp32", row["memory_fraction"], "fraction",
                                higher_is_better=False,
                                note=f"{row['weight_bytes'] / 2**20:.0f} MiB vs {fp32_bytes / 2**20:.0f} MiB fp32 "
                                     "(the weights a decode step streams; an embedding is read one row per token)"))
        if row.get("decode_speedup") is not None:
            how = (f"interleaved with every row, {new_tokens} new tokens" if name in fast_rows else
                   f"timed in a pair with fp32 on {slow_tokens} new tokens (about "
                   f"{warm[name] / warm['fp32']:.0f}x slower than fp32 in the warm-up)")
            figures.append(reported(f"{name} / fp32 decode speed (batch 1)", row["decode_speedup"], "x",
                                    target=TARGETS.get(name), claim=quantization_claim(name, 1),
                                    note=f"{row['decode_tokens_per_s']:.1f} tokens/s, "
                                         f"{row['bandwidth_fraction']:.0%} of copy bandwidth; {how}; "
                                         f"{row.get('kernel', 'dense matmul')}", busy=row["busy"]))
        if row.get("decode_speedup_bf16") is not None:
            figures.append(reported(f"{name} / bf16 decode speed (batch 1)", row["decode_speedup_bf16"], "x",
                                    note=f"{row.get('kernel')}: where the kernel computes in bf16, this ratio "
                                         "is what the smaller weights add over a bf16 model", busy=row["busy_bf16"]))
        figures.append(reported(f"{name} perplexity increase over fp32", row["perplexity_increase"], "fraction",
                                higher_is_better=False,
                                note=f"perplexity {row['perplexity']:.2f} vs {math.exp(fp32_nll):.2f} on "
                                     f"{len(eval_ids)} tokens of the evaluation text ({row['quality_from']})"))
        figures.append(reported(f"{name} top-1 agreement with fp32", row["top1_agreement"], "fraction"))
    return {"rows": rows, "fp32_weight_bytes": fp32_bytes, "eval_tokens": len(eval_ids),
            "prompt_tokens": len(ids), "new_tokens": new_tokens,
            "timings_s": {k: v.to_dict() for k, v in timings.items()},
            "note": "weight-only quantization; activations stay fp32 (bf16 inside the fast kernels)",
            "figures": figures}
