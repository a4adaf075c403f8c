"""Notebook 02's section: throughput against batch size, padding waste, and Hugging Face
on the same padded batch.

Introduced in notebook 02 (batching); ``python -m labsupport bench --sections batching``.
"""

from __future__ import annotations

import torch

from ..batching import left_pad, padding_waste, sorted_batches
from ..generation import chat_prompt, generate
from ..hardware import bf16_supported
from ..measure import time_fn, time_side_by_side
from .core import BenchContext, reported
from .options import BenchOptions
from .peers import hf_padded_generate_fn

STORY_PROMPT = "Tell me a story about a lighthouse keeper."
BATCHING_PROMPTS = [        # very different lengths in one batch: the padding example (notebook 02 too)
    "Hi!",
    "Name three colours.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in detail, step by step, how a refrigerator moves heat from its inside to the room around it.",
    "Summarize the plot of a detective story in which a missing painting is found in the museum's own basement.",
    "List five vegetables.",
    "Why is the sky blue? Give the physical reason, mention Rayleigh scattering, and explain sunsets too.",
]


def section_batching(ctx: BenchContext, options: BenchOptions) -> dict:
    """Throughput and latency against batch size; padding waste; Hugging Face on the same padded batch.

    Introduced in notebook 02 (batching). Reads batch_new_tokens, batch_sizes and repeats
    (the batch-16/batch-1 pair and the Hugging Face peer).
    """
    model, tok = ctx.model(torch.float32)
    new_tokens = options.batch_new_tokens
    sizes = list(options.batch_sizes)
    prompt = tok.encode(chat_prompt(tok, STORY_PROMPT))

    def run(batch):
        return lambda: generate(model, [prompt] * batch, new_tokens, eos_token_ids=())

    sweep = []
    for batch in sizes:
        seconds = time_fn(run(batch), ctx.device, warmup=1 if batch <= 16 else 0, repeats=1).median
        sweep.append({"batch": batch, "seconds": seconds, "tokens_per_s": batch * new_tokens / seconds,
                      "ms_per_step": 1e3 * seconds / new_tokens})
    # the headline ratio: batch 16 against batch 1, interleaved; in fp32, and in bf16
    # where the hardware has it (16-bit matrix units make the compute-bound side cheaper)
    def batch16_over_batch1(m):
        runs = {b: (lambda b=b: generate(m, [prompt] * b, new_tokens, eos_token_ids=())) for b in (1, 16)}
        timings = time_side_by_side({f"batch {b}": fn for b, fn in runs.items()}, ctx.device, warmup=1,
                                    repeats=options.repeats)
        return 16 * timings["batch 1"].median / timings["batch 16"].median, timings

    ratio, pair = batch16_over_batch1(model)
    bf16_ratio, bf16_skipped = None, None
    if bf16_supported(ctx.device):
        bf16_ratio, _ = batch16_over_batch1(ctx.model(torch.bfloat16)[0])
    else:
        bf16_skipped = ("bf16 not timed: this device has no bf16 hardware, and emulated 16-bit "
                        "matmuls would measure the emulation, not batching (notebook 03 times it)")

    # padding: very different prompt lengths in one batch, against the same prompts sorted by length
    prompts = [tok.encode(chat_prompt(tok, q)) for q in BATCHING_PROMPTS]
    waste = padding_waste([len(p) for p in prompts])
    groups = sorted_batches(prompts, 4)
    sorted_waste = sum(padding_waste([len(prompts[i]) for i in g]) * len(g) for g in groups) / len(prompts)

    # Hugging Face generate() on the same left-padded batch
    hf = ctx.hf_model(torch.float32)
    padded = left_pad(prompts, pad_id=tok.pad_token_id or 0)
    ours_out, hf_out = {}, {}

    def ours():
        ours_out["r"] = generate(model, prompts, new_tokens, eos_token_ids=())

    hf_run = hf_padded_generate_fn(hf, padded, new_tokens)

    def theirs():
        hf_out["t"] = hf_run()

    side = time_side_by_side({"labsupport": ours, "huggingface": theirs}, ctx.device, warmup=1,
                             repeats=options.repeats)
    same = ours_out["r"].tokens.tolist() == hf_out["t"].tolist()
    vs_hf = side["huggingface"].median / side["labsupport"].median
    return {
        "new_tokens": new_tokens, "sweep": sweep,
        "batch16_over_batch1": ratio, "batch16_over_batch1_bf16": bf16_ratio,
        "bf16_skipped": bf16_skipped, "timings_s": {k: v.to_dict() for k, v in pair.items()},
        "padding": {"lengths": [len(p) for p in prompts], "waste": waste, "sorted_waste": sorted_waste},
        "vs_huggingface": {"speedup": vs_hf, "same_tokens": same,
                           "timings_s": {k: v.to_dict() for k, v in side.items()}},
        "figures": [
            reported("throughput at batch 16 / batch 1 (fp32 decode)", ratio, "x", target=8.0,
                     claim="batch 1 -> 16 might give 10-15x throughput",
                     note=f"{new_tokens} new tokens per row, one prompt repeated"),
            *([reported("throughput at batch 16 / batch 1 (bf16 decode)", bf16_ratio, "x", target=8.0,
                        claim="batch 1 -> 16 might give 10-15x throughput",
                        note="bf16 weights and activations on the CPU's bf16 instructions")]
              if bf16_ratio is not None else []),
            reported("padding waste of a batch of 8 mixed-length prompts", waste, "fraction",
                     note=f"{100 * sorted_waste:.0f}% when sorted into batches of 4 by length"),
            reported("labsupport / HF generate on the same padded batch of 8", vs_hf, "x",
                     note=f"same tokens: {same}"),
        ],
    }
