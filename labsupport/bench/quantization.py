"""Notebook 04's section: memory, decode speed and quality per method, side by side.

Introduced in notebook 04 (quantization); ``python -m labsupport bench --sections quantization``.

Rows: fp32, bf16, fp16, int8 (absmax, fast kernel), int4 groups of 32 and 128,
bitsandbytes LLM.int8() and NF4. Every row is the run's variant (`BenchContext.variants`:
the 16-bit rows cast from the one fp32 model, the quantized ones copied from it and
quantized once), the same models the other sections and the self-draft use. Its speed is
timed on the same variant of `BenchContext.timing_variants`: the course's model on a CPU or
a T4; on a big GPU, where the 135M model's step is launch-bound, random weights at
SmolLM2-1.7B's shape (``timed_model`` says which), while memory and quality stay the
course's model's.

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

The bitsandbytes rows decode eager everywhere (`EAGER_ROWS`): LLM.int8() reads its outliers
on the host (``outliers.any()``, ``argwhere``), which a CUDA graph cannot capture, so on a GPU
their path says so (`EAGER_LABEL`) beside fp32's CUDA graphs. A row that fails (its variant,
its quality or its decode) is recorded as failed with its one-line reason (``"failed"``) and
the other rows go on; only fp32's failure, which every ratio needs, fails the section.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from statistics import median as _median

import torch

from ..lab.busy import busy_reason
from ..lab.roofs import fraction_words
from ..errors import LabError
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..engine.hardware import fp16_fast
from ..lab.measure import Timing, require_graphed, time_side_by_side, timed_compile
from ..lab.quality import (eval_tokens, logits_of, perplexity_from_logits, quantized_bytes, resident_bytes,
                           top1_agreement_from_logits)
from ..lab.workloads import DEFAULT_PROMPT
from .core import BenchContext, failed_figure, failure_reason, reported
from .options import SectionOptions, count

# row name -> (precision, weights, group size): a `ModelVariants` key
ROWS = {"fp32": ("float32", "float", None), "bf16": ("bfloat16", "float", None), "fp16": ("float16", "float", None),
        "int8": ("float32", "int8", None), "int4 g32": ("float32", "int4", 32), "int4 g128": ("float32", "int4", 128),
        "bnb int8": ("float32", "bnb-int8", None), "bnb nf4": ("float32", "bnb-nf4", None)}
TARGETS = {"int8": 2.0, "int4 g32": 2.5, "int4 g128": 2.5}
# Rows timed eager on every device (LLM.int8() cannot be captured as a CUDA graph; NF4 is timed
# like it, as bitsandbytes' other row), and what their decode path says on a GPU.
EAGER_ROWS = ("bnb int8", "bnb nf4")
EAGER_LABEL = "eager (bitsandbytes: not capturable as a CUDA graph)"


@dataclass(frozen=True)
class QuantizationOptions(SectionOptions):
    """The quantization section's options (the same on a CPU and a GPU). Introduced in notebook 04.

    new_tokens: new tokens per decode timing of the rows (at least 2: speed is per decode
    step); slow_new_tokens: new tokens of the rows timed in a pair with fp32 because they are
    very slow (at least 2, at most new_tokens); repeats: timed repeats, interleaved;
    eval_tokens: tokens of the evaluation text behind perplexity and top-1 agreement."""

    SECTION = "quantization"
    new_tokens: int = count(32, minimum=2)
    slow_new_tokens: int = count(8, minimum=2)
    repeats: int = count(3)
    eval_tokens: int = count(512, minimum=2)

    def check(self) -> None:
        if self.slow_new_tokens > self.new_tokens:
            self.refuse(f"slow_new_tokens ({self.slow_new_tokens}) must not exceed new_tokens ({self.new_tokens}): "
                        "the slow rows are timed on fewer tokens, never more.")

    def with_counts(self, new_tokens: int | None = None, repeats: int | None = None):
        """As `SectionOptions.with_counts`, new_tokens kept at 2 or more and the slow rows
        never above it. Introduced in notebook 04 (quantization)."""
        if new_tokens is None:
            return super().with_counts(repeats=repeats)
        tokens = max(2, new_tokens)
        slow = max(2, min(self.slow_new_tokens, tokens))
        return type(self)(**{**self.to_dict(), "new_tokens": tokens, "slow_new_tokens": slow}).with_counts(
            repeats=repeats)


def _fp16_rounded(model):
    """fp32 model whose weights went through fp16 and back: fp16 storage's rounding, fp32 speed.
    Introduced in notebook 04 (quantization)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in rounded.parameters():
            tensor.copy_(tensor.half().float())
    return rounded


@dataclass(frozen=True)
class _Fp32:
    """What the other rows are set against: the fp32 model's perplexity and bytes. Notebook 04 (quantization)."""

    perplexity: float
    weight_bytes: int
    resident_bytes: int
    eval_tokens: int


@dataclass
class _Decodes:
    """The rows' timed decodes: seconds per step by "row@tokens", paths, compile seconds. Notebook 04 (quantization)."""

    device: torch.device
    models: dict                                 # row name -> the variant its speed is timed on
    ids: list[int]
    graphed: bool
    steps: dict[str, list[float]] = field(default_factory=dict)
    paths: dict[str, set] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)     # row name -> why its decode failed

    def decode(self, name: str, tokens: int):
        """A call that decodes `tokens` new tokens with row `name`, its step kept; graphed on a GPU
        except the `EAGER_ROWS`. A failure is kept in `failed` (later calls of that row do nothing),
        never raised. Notebook 04 (quantization)."""
        m, eager = self.models[name], name in EAGER_ROWS

        def run():
            if name in self.failed:
                return
            try:
                result = generate(m, self.ids, tokens, eos_token_ids=(), compile=self.graphed and not eager)
                if not eager:
                    require_graphed(result, f"the {name} decode", self.device)
            except Exception as error:                 # noqa: BLE001 - the row is failed, the others go on
                self.failed[name] = failure_reason(error)
                return
            path = EAGER_LABEL if eager and self.graphed else result.decode_path
            self.paths.setdefault(name, set()).add(path)
            self.compile_s[name] = self.compile_s.get(name, 0.0) + result.warmup_seconds
            self.steps.setdefault(f"{name}@{tokens}", []).append(result.decode_seconds / (tokens - 1))
        return run


def section_quantization(ctx: BenchContext, options: QuantizationOptions) -> dict:
    """Memory, decode speed (ratio to fp32) and quality of each precision and quantization.

    Introduced in notebook 04 (quantization). Its claims:
    `claims.quantization.quantization_section_claims` (the rows).
    """
    model, tok = ctx.model(torch.float32)
    new_tokens, slow_tokens = options.new_tokens, options.slow_new_tokens
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))
    eval_ids = eval_tokens(tok, max_tokens=options.eval_tokens)
    fp16_runs = ctx.device.type == "cuda" or fp16_fast(ctx.device)

    # Every row is a variant of the run: made once from the fp32 model, shared with the other sections;
    # its speed is timed on the same variant of the timing model (the course's model but on a big GPU).
    variants, speed, rows = _variants(ctx)

    # Memory and quality, one row at a time.
    fp32 = _memory_and_quality(model, variants, rows, eval_ids, fp16_runs)

    # Speed: decode tokens/s, all rows interleaved; very slow rows in a pair with fp32 on fewer tokens.
    # On a GPU every row is a replayed CUDA graph (`measure.timed_compile`), its compiling apart.
    decodes = _Decodes(ctx.device, speed, ids, timed_compile(ctx.device))
    timed = [n for n in variants if n != "fp16" or fp16_runs]
    timings, fast_rows, how = _time_decodes(decodes, timed, options)
    for name in timed:
        if name in decodes.failed:
            rows[name].update(decode_speedup=None, failed=decodes.failed[name],
                              speed_note=f"failed: {decodes.failed[name]}")
            continue
        tokens = new_tokens if name in fast_rows else slow_tokens
        rows[name].update(_speed_columns(ctx, decodes, name, tokens))
        bf16_ok = "bf16" in fast_rows and "bf16" not in decodes.failed
        if bf16_ok and name in fast_rows and rows[name]["kind"] in ("int8", "int4"):
            rows[name].update(_bf16_columns(decodes, name, tokens))
    if "fp16" in rows and "fp16" not in timed:
        rows["fp16"]["decode_speedup"] = None
        rows["fp16"]["speed_note"] = "not timed: fp16 matmuls are emulated on this CPU (slow)"

    return {"rows": rows, "fp32_weight_bytes": fp32.weight_bytes, "eval_tokens": fp32.eval_tokens,
            "prompt_tokens": len(ids), "new_tokens": new_tokens, "timed_model": ctx.timed_model,
            "timings_s": {k: v.to_dict() for k, v in timings.items()},
            "note": "weight-only quantization; activations stay fp32 (bf16 inside the fast kernels). "
                    + ctx.timed_note(),
            "figures": _figures(ctx, rows, fp32, how)}


def _variants(ctx: BenchContext) -> tuple[dict, dict, dict]:
    """Each row's variant, its timed variant, and its row (kind, kernel or error). Notebook 04 (quantization)."""
    variants, speed, rows = {}, {}, {}
    for name, (precision, weights, group_size) in ROWS.items():
        row = rows[name] = {"kind": "cast" if weights == "float" else weights}
        try:
            variants[name] = ctx.variants.get(precision, weights, group_size=group_size or 32)
            speed[name] = ctx.timing_variants.get(precision, weights, group_size=group_size or 32)
            if weights != "float":              # the kernel of the layers timed
                handle = ctx.timing_variants.handle(precision, weights, group_size=group_size or 32)
                row["kernels"], row["kernel"] = handle.kernels, handle.describe()
        except LabError as error:                  # e.g. bitsandbytes missing or not on this device
            row["error"] = str(error)
            variants.pop(name, None)
    return variants, speed, rows


def _memory_and_quality(model, variants: dict, rows: dict, eval_ids, fp16_runs: bool) -> _Fp32:
    """Each row's bytes, perplexity and top-1 agreement, set against fp32's. Notebook 04 (quantization)."""
    fp32_logits = logits_of(model, eval_ids)
    fp32_ppl = perplexity_from_logits(fp32_logits, eval_ids)
    fp32_bytes = model.weight_bytes()
    fp32_resident = resident_bytes(model)
    for name, m in list(variants.items()):
        try:
            row = {"weight_bytes": quantized_bytes(m), "tensor_bytes": resident_bytes(m)}
            if name == "fp16" and not fp16_runs:
                scored, how = _fp16_rounded(model), "fp16-rounded weights computed in fp32"
            else:
                scored, how = m, "as run"
            logits = fp32_logits if name == "fp32" else logits_of(scored, eval_ids)
            ppl = perplexity_from_logits(logits, eval_ids)
        except Exception as error:                     # noqa: BLE001 - the row is failed, the others go on
            if name == "fp32":
                raise
            reason = failure_reason(error)
            rows[name].update(failed=reason, error=f"failed while measuring its memory and quality: {reason}")
            del variants[name]                         # not timed either
            continue
        rows[name].update(row, memory_fraction=row["weight_bytes"] / fp32_bytes,
                          resident_fraction=row["tensor_bytes"] / fp32_resident, perplexity=ppl,
                          perplexity_increase=ppl / fp32_ppl - 1,
                          top1_agreement=top1_agreement_from_logits(fp32_logits, logits), quality_from=how)
    return _Fp32(fp32_ppl, fp32_bytes, fp32_resident, len(eval_ids))


def _time_decodes(d: _Decodes, timed: list[str], options: QuantizationOptions) -> tuple[dict, list, dict]:
    """The rows' decodes timed, slow ones paired with fp32: (timings, fast rows, how). Notebook 04 (quantization)."""
    new_tokens, slow_tokens = options.new_tokens, options.slow_new_tokens
    for name in timed:                                             # warm-up, also sizes each row
        d.decode(name, new_tokens)()
    _require_fp32(d)
    warm = {n: d.steps.pop(f"{n}@{new_tokens}")[0] for n in timed if n not in d.failed}
    fast_rows = [n for n in warm if warm[n] <= 5 * warm["fp32"]]
    slow_rows = [n for n in warm if n not in fast_rows]
    timings = time_side_by_side({n: d.decode(n, new_tokens) for n in fast_rows}, d.device,
                                warmup=0, repeats=options.repeats)
    for name in slow_rows:
        pair = time_side_by_side({"fp32": d.decode("fp32", slow_tokens), name: d.decode(name, slow_tokens)},
                                 d.device, warmup=0, repeats=1)
        timings[f"{name} (pair)"] = pair[name]
    _require_fp32(d)
    how = {name: (f"interleaved with every row, {new_tokens} new tokens" if name in fast_rows else
                  f"timed in a pair with fp32 on {slow_tokens} new tokens (about "
                  f"{warm[name] / warm['fp32']:.0f}x slower than fp32 in the warm-up)") for name in warm}
    return timings, fast_rows, how


def _require_fp32(d: _Decodes) -> None:
    """One sentence when fp32's decode failed: every speed ratio is set against it. Notebook 04 (quantization)."""
    if "fp32" in d.failed:
        raise LabError(f"The fp32 decode, which every other row's speed is set against, failed: {d.failed['fp32']}.")


def _speed_columns(ctx: BenchContext, d: _Decodes, name: str, tokens: int) -> dict:
    """Row `name`'s decode speed, its ratio to fp32's and its shares of read and copy bandwidth. Notebook 04 (quantization)."""
    step, read = _median(d.steps[f"{name}@{tokens}"]), quantized_bytes(d.models[name])   # the timed model's bytes
    return dict(decode_tokens_per_s=1 / step,
                decode_speedup=_median(d.steps[f"fp32@{tokens}"]) / step,
                timed_on_new_tokens=tokens,
                bandwidth_bytes_per_s=read / step,
                **ctx.hardware.bandwidth_fractions(read / step),
                decode_path=", ".join(sorted(d.paths[name])), compile_s=d.compile_s[name],
                timing=Timing(d.steps[f"{name}@{tokens}"]).to_dict(),
                busy=busy_reason({"fp32": Timing(d.steps[f"fp32@{tokens}"]),
                                  name: Timing(d.steps[f"{name}@{tokens}"])}))


def _bf16_columns(d: _Decodes, name: str, tokens: int) -> dict:
    """A quantized row's decode speed as a ratio to bf16's, and its busy reason. Notebook 04 (quantization)."""
    step = _median(d.steps[f"{name}@{tokens}"])
    return {"decode_speedup_bf16": _median(d.steps[f"bf16@{tokens}"]) / step,
            "busy_bf16": busy_reason({"bf16": Timing(d.steps[f"bf16@{tokens}"]),
                                      name: Timing(d.steps[f"{name}@{tokens}"])})}


def _figures(ctx: BenchContext, rows: dict, fp32: _Fp32, how: dict) -> list[dict]:
    """Every row's figures against fp32: memory, decode speed, quality. Notebook 04 (quantization)."""
    figures = []
    for name, row in rows.items():
        if name == "fp32" or "error" in row:
            if "failed" in row:
                figures.append(failed_figure(name, row["error"]))
            elif "error" in row:
                figures.append(reported(f"{name}: not run", float("nan"), "", note=row["error"]))
            continue
        figures.append(reported(f"{name} resident bytes / fp32", row["resident_fraction"], "fraction",
                                higher_is_better=False,
                                note=f"{row['tensor_bytes'] / 2**20:.0f} MiB vs {fp32.resident_bytes / 2**20:.0f} "
                                     "MiB fp32 (every tensor the model holds, float lookup tables included)"))
        figures.append(reported(f"{name} bytes read per token / fp32", row["memory_fraction"], "fraction",
                                higher_is_better=False,
                                note=f"{row['weight_bytes'] / 2**20:.0f} MiB vs {fp32.weight_bytes / 2**20:.0f} "
                                     "MiB fp32 (the weights a decode step streams; an embedding is read one row "
                                     "per token)"))
        figures += _speed_figures(ctx, name, row, how.get(name), rows["fp32"])
        figures.append(reported(f"{name} perplexity increase over fp32", row["perplexity_increase"], "fraction",
                                higher_is_better=False,
                                note=f"perplexity {row['perplexity']:.2f} vs {fp32.perplexity:.2f} on "
                                     f"{fp32.eval_tokens} tokens of the evaluation text ({row['quality_from']})"))
        figures.append(reported(f"{name} top-1 agreement with fp32", row["top1_agreement"], "fraction"))
    return figures


def _speed_figures(ctx: BenchContext, name: str, row: dict, how: str | None, fp32_row: dict) -> list[dict]:
    """A row's decode speed over fp32's, and over bf16's where it was timed. Notebook 04 (quantization)."""
    figures = []
    if row.get("failed"):
        figures.append(failed_figure(f"{name} / fp32 decode speed (batch 1)", row["failed"]))
    if row.get("decode_speedup") is not None:
        figures.append(reported(f"{name} / fp32 decode speed (batch 1)", row["decode_speedup"], "x",
                                target=TARGETS.get(name),
                                note=f"{row['decode_tokens_per_s']:.1f} tokens/s, "
                                     f"{fraction_words(row)}; {how}; "
                                     f"{row.get('kernel', 'dense matmul')}; model {ctx.timed_model}; "
                                     f"decode path: {row['decode_path']} (fp32: {fp32_row['decode_path']})",
                                busy=row["busy"]))
    if row.get("decode_speedup_bf16") is not None:
        figures.append(reported(f"{name} / bf16 decode speed (batch 1)", row["decode_speedup_bf16"], "x",
                                note=f"{row.get('kernel')}: where the kernel computes in bf16, this ratio "
                                     f"is what the smaller weights add over a bf16 model; model {ctx.timed_model}",
                                busy=row["busy_bf16"]))
    return figures
