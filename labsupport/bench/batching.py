"""Notebook 02's section: throughput against batch size, padding waste, and Hugging Face
on the same padded batch.

Introduced in notebook 02 (batching); ``python -m labsupport bench --sections batching``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.batching_timing import batch_speedup
from ..engine.padding import left_pad, padding_waste
from ..lab.batching import sorted_batches
from ..lab.busy import busy_reason
from ..lab.roofs import fraction_words
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..engine.hardware import bf16_supported
from ..lab.measure import (WARMUP_TOKENS, mark_graphed, require_graphed, time_fn, time_side_by_side,
                           timed_compile)
from ..lab.roofline import ridge_batch
from ..lab.timing_model import batches_that_fit
from ..lab.workloads import BATCHING_PROMPTS, PRESETS, STORY_PROMPT
from .core import BenchContext, GraphCount, reported
from .options import SectionOptions, count, counts
from .peers.huggingface import hf_padded_generate_fn


@dataclass(frozen=True)
class BatchingOptions(SectionOptions):
    """The batching section's options. Introduced in notebook 02 (batching).

    new_tokens: new tokens per row in the sweep, the batch-16/batch-1 pair and the Hugging
    Face peer; sizes: batch sizes of the throughput sweep (`workloads.PRESETS`' ``batch_sizes``:
    up to 64 on a CPU, 512 on a GPU); repeats: timed repeats of the pair and the peer."""

    SECTION = "batching"
    new_tokens: int = count(32)
    sizes: tuple[int, ...] = counts(PRESETS["cpu"].batch_sizes)
    repeats: int = count(5)

    @classmethod
    def gpu_sizes(cls) -> dict:
        return {"sizes": PRESETS["gpu"].batch_sizes}


def versus_huggingface(model, hf_model, prompts: list[list[int]], padded, new_tokens: int,
                       repeats: int = 3) -> tuple[dict, dict]:
    """labsupport's `generate` on `prompts` and Hugging Face's greedy generate() on the same batch
    left-padded (`padded`, from `padding.left_pad`), timed side by side, no early stop.

    Introduced in notebook 02 (batching). Returns (the `Timing` of "labsupport" and of
    "huggingface", the new tokens of each one's last run by the same names, each (batch, new_tokens)).
    On a GPU both are replayed CUDA graphs (`measure.timed_compile`): ours compiled + CUDA graphs,
    Hugging Face's static cache + torch.compile; tokens["paths"] says each one's decode path,
    Hugging Face's as torch counted it around its first (compiling) run (`GraphCount`).
    """
    graphed = timed_compile(model.device)
    tokens = {"paths": {"labsupport": set(), "huggingface": set()}}
    hf_count = GraphCount()
    hf_run = hf_count.first_call(hf_padded_generate_fn(hf_model, padded, new_tokens, graphed=graphed))

    hf_warmup = hf_padded_generate_fn(hf_model, padded, WARMUP_TOKENS, graphed=graphed)

    def run_ours(n):
        result = require_graphed(generate(model, prompts, n, eos_token_ids=(), compile=graphed),
                                 "labsupport's padded batch", model.device)
        tokens["paths"]["labsupport"].add(result.decode_path)
        return result

    def ours():
        tokens["labsupport"] = run_ours(new_tokens).tokens

    def huggingface():
        tokens["huggingface"] = hf_run()
        tokens["paths"]["huggingface"] = {hf_count.hf_path(graphed)}

    warmups = {"labsupport": lambda: run_ours(WARMUP_TOKENS), "huggingface": hf_warmup}
    timings = time_side_by_side({"labsupport": ours, "huggingface": huggingface}, model.device, warmup=1,
                                repeats=repeats, warmup_fns=warmups)
    return timings, tokens


def section_batching(ctx: BenchContext, options: BatchingOptions) -> dict:
    """Throughput and latency against batch size; padding waste; Hugging Face on the same padded batch.

    Introduced in notebook 02 (batching). Each timed figure carries the busy reason of its
    timings (`busy`, their spread); the sweep's own check is notebook 02's
    (`claims.batching.batch_sweep_busy_reason`). Its claims: `claims.batching.batching_section_claims`
    (the sweep, the pair, the padding and the roofline's predicted ridge batch).
    """
    model, tok = ctx.model(torch.float32)
    timed, timed_name = ctx.timing_model(torch.float32)      # the sweep's model: at 1.7B's shape on a big GPU
    new_tokens = options.new_tokens
    prompt = tok.encode(chat_prompt(tok, STORY_PROMPT))
    sweep, capped, paths = _sweep(ctx, timed, prompt, list(options.sizes), new_tokens)
    # the headline ratio: batch 16 against batch 1, interleaved; in fp32, and in bf16
    # where the hardware has it (16-bit matrix units make the compute-bound side cheaper)
    ratio, pair = batch_speedup(timed, prompt, 16, new_tokens, warmup=1, repeats=options.repeats)
    bf16_ratio, bf16_skipped, bf16_pair = _bf16_speedup(ctx, prompt, new_tokens, options.repeats)

    # padding: very different prompt lengths in one batch, against the same prompts sorted by length
    prompts = [tok.encode(chat_prompt(tok, q)) for q in BATCHING_PROMPTS]
    waste, sorted_waste = _padding_waste(prompts)

    # Hugging Face generate() on the same left-padded batch
    vs_hf, hf_figure = _versus_hf(ctx, model, tok, prompts, new_tokens, options.repeats)
    ridge = ridge_batch(ctx.hardware, timed.config, timed.dtype, context=len(prompt) + new_tokens // 2)
    return {
        "new_tokens": new_tokens, "sweep": sweep, "capped": capped, "ridge_batch": ridge,
        "decode_paths": sorted(paths),
        "device_type": ctx.device.type,
        "timed_model": timed_name,
        "batch16_over_batch1": ratio, "batch16_over_batch1_bf16": bf16_ratio,
        "bf16_skipped": bf16_skipped, "timings_s": {k: v.to_dict() for k, v in pair.items()},
        "padding": {"lengths": [len(p) for p in prompts], "waste": waste, "sorted_waste": sorted_waste},
        "vs_huggingface": vs_hf,
        "figures": [
            mark_graphed(reported("throughput at batch 16 / batch 1 (fp32 decode)", ratio, "x", target=8.0,
                                  busy=busy_reason(pair),
                                  note=f"{new_tokens} new tokens per row, one prompt repeated; weights read per "
                                       "second by batch: " + ", ".join(
                                           f"{r['batch']}: {fraction_words(r)}" for r in sweep)),
                         paths, ctx.device),
            *([reported("throughput at batch 16 / batch 1 (bf16 decode)", bf16_ratio, "x", target=8.0,
                        busy=busy_reason(bf16_pair),
                        note="bf16 weights and activations on the CPU's bf16 instructions")]
              if bf16_ratio is not None else []),
            reported("padding waste of a batch of 8 mixed-length prompts", waste, "fraction",
                     note=f"{100 * sorted_waste:.0f}% when sorted into batches of 4 by length"),
            hf_figure,
        ],
    }


def _sweep(ctx: BenchContext, timed, prompt: list[int], sizes: list[int], new_tokens: int) -> tuple[list, list, set]:
    """Throughput by batch size, one prompt repeated: (rows, sizes capped, decode paths). Notebook 02 (batching)."""
    graphed = timed_compile(ctx.device)          # on a GPU a replayed CUDA graph, every row
    paths: set = set()

    def run(batch, n=new_tokens):
        def call():
            result = require_graphed(generate(timed, [prompt] * batch, n, eos_token_ids=(), compile=graphed),
                                     f"the batch-{batch} sweep", ctx.device)
            paths.add(result.decode_path)
            return result
        return call

    # on a GPU, the batch sizes whose cache and prefill fit the free memory (the rest said in "capped")
    sizes, capped = batches_that_fit(timed.config, sizes, len(prompt) + new_tokens, timed.dtype, ctx.device,
                                     tokens=len(prompt))
    sweep = []
    for batch in sizes:
        seconds = time_fn(run(batch), ctx.device, warmup=1 if batch <= 16 else 0, repeats=1,
                          warmup_fn=run(batch, WARMUP_TOKENS)).median
        sweep.append({"batch": batch, "seconds": seconds, "tokens_per_s": batch * new_tokens / seconds,
                      "ms_per_step": 1e3 * seconds / new_tokens,
                      # every weight read once per step (the prompt's prefill counted in the time)
                      **ctx.hardware.bandwidth_fractions(timed.weight_bytes() * new_tokens / seconds)})
    return sweep, capped, paths


def _bf16_speedup(ctx: BenchContext, prompt: list[int], new_tokens: int, repeats: int) -> tuple:
    """Batch 16 over batch 1 in bf16: (ratio, None, pair), or (None, why not, {}). Notebook 02 (batching)."""
    if bf16_supported(ctx.device):
        bf16_ratio, bf16_pair = batch_speedup(ctx.timing_model(torch.bfloat16)[0], prompt, 16, new_tokens,
                                              warmup=1, repeats=repeats)
        return bf16_ratio, None, bf16_pair
    return None, ("bf16 not timed: this device has no bf16 hardware, and emulated 16-bit "
                  "matmuls would measure the emulation, not batching (notebook 03 times it)"), {}


def _padding_waste(prompts: list[list[int]]) -> tuple[float, float]:
    """Padding waste of the prompts in one batch, and sorted into batches of 4 by length. Notebook 02 (batching)."""
    waste = padding_waste([len(p) for p in prompts])
    groups = sorted_batches(prompts, 4)
    sorted_waste = sum(padding_waste([len(prompts[i]) for i in g]) * len(g) for g in groups) / len(prompts)
    return waste, sorted_waste


def _versus_hf(ctx: BenchContext, model, tok, prompts: list[list[int]], new_tokens: int,
               repeats: int) -> tuple[dict, dict]:
    """Ours against HF generate() on the same left-padded batch: (comparison, figure). Notebook 02 (batching)."""
    hf = ctx.hf_model(torch.float32)
    padded = left_pad(prompts, pad_id=tok.pad_token_id or 0)
    side, tokens = versus_huggingface(model, hf, prompts, padded, new_tokens, repeats=repeats)
    same = tokens["labsupport"].tolist() == tokens["huggingface"].tolist()
    vs_hf = side["huggingface"].median / side["labsupport"].median
    figure = mark_graphed(reported("labsupport / HF generate on the same padded batch of 8", vs_hf, "x",
                                   busy=busy_reason(side), note=f"same tokens: {same}"),
                          [p for ps in tokens["paths"].values() for p in ps], ctx.device)
    return {"speedup": vs_hf, "same_tokens": same, "timings_s": {k: v.to_dict() for k, v in side.items()}}, figure
