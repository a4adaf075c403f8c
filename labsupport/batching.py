"""Batching prompts of different lengths: left padding, the attention mask, positions.

Introduced in notebook 02 (batching).

A batch shares one KV cache write position per step (`StaticKVCache.length`), so
prompts of different lengths are lined up on the right: shorter ones get padding
tokens on the left. Three things keep the padding invisible:

* the attention mask hides padding keys from every query;
* position ids count real tokens only (a row's first real token is position 0);
* a row that ends (end-of-sequence) stops counting tokens while the others go on.

The padding still costs arithmetic: `padding_waste` says how much, and sorting
prompts by length before batching them is the usual remedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LabError


@dataclass
class PaddedBatch:
    """Left-padded prompts. tokens, attention_mask, positions: (batch, T)."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor        # True for real tokens, False for padding
    positions: torch.Tensor             # 0, 1, 2, ... along each row's real tokens
    lengths: list[int]

    @property
    def is_padded(self) -> bool:
        return min(self.lengths) != max(self.lengths)

    @property
    def padding_fraction(self) -> float:
        return padding_waste(self.lengths)


def left_pad(prompts, pad_id: int, device="cpu") -> PaddedBatch:
    """Line prompts (lists of ids, or a (batch, T) tensor) up on the right with `pad_id`."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    elif prompts and isinstance(prompts[0], int):
        prompts = [list(prompts)]
    if not prompts:
        raise LabError("The prompt is empty (no token ids and no prompts); give at least one token.")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise LabError(f"Prompt {lengths.index(0)} of the batch is empty; give every prompt at least one token.")
    width = max(lengths)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = True
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)            # (batch, T)
    return PaddedBatch(tokens.to(device), mask.to(device), positions.to(device), lengths)


def padding_waste(lengths: list[int]) -> float:
    """Fraction of a padded prefill's token slots that are padding: 1 - sum(L) / (B * max L)."""
    if not lengths:
        raise LabError("padding_waste needs at least one prompt length.")
    return 1.0 - sum(lengths) / (len(lengths) * max(lengths))


def sorted_batches(prompts: list, batch_size: int) -> list[list[int]]:
    """Indices of `prompts` grouped into batches of similar length (longest first),
    the usual remedy for padding waste. Returns a list of index lists."""
    if batch_size < 1:
        raise LabError(f"batch_size must be at least 1, got {batch_size}.")
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


# --- measuring it (notebook 02; `python -m labsupport bench --sections batching`) ---------

BATCHING_PROMPTS = [
    "Hi!",
    "Name three colours.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in detail, step by step, how a refrigerator moves heat from its inside to the room around it.",
    "Summarize the plot of a detective story in which a missing painting is found in the museum's own basement.",
    "List five vegetables.",
    "Why is the sky blue? Give the physical reason, mention Rayleigh scattering, and explain sunsets too.",
]


def section_batching(ctx, options: dict) -> dict:
    """Throughput and latency against batch size; padding waste; Hugging Face on the same padded batch."""
    import torch

    from .bench import figure, hf_greedy_config
    from .generate import chat_prompt, generate
    from .measure import time_fn, time_side_by_side

    model, tok = ctx.model(torch.float32)
    new_tokens = options.get("batch_new_tokens", 32)
    on_gpu = ctx.device.type == "cuda"
    sizes = options.get("batch_sizes") or ([1, 2, 4, 8, 16, 32, 64, 128, 256] if on_gpu else [1, 2, 4, 8, 16, 32, 64])
    prompt = tok.encode(chat_prompt(tok, "Tell me a story about a lighthouse keeper."))

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
                                    repeats=options.get("repeats", 3))
        return 16 * timings["batch 1"].median / timings["batch 16"].median, timings

    ratio, pair = batch16_over_batch1(model)
    from .hardware import bf16_supported
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

    config = hf_greedy_config(hf, new_tokens)

    @torch.inference_mode()
    def theirs():
        hf_out["t"] = hf.generate(padded.tokens, attention_mask=padded.attention_mask.long(),
                                  generation_config=config)[:, padded.tokens.shape[1]:]

    side = time_side_by_side({"labsupport": ours, "huggingface": theirs}, ctx.device, warmup=1,
                             repeats=options.get("repeats", 3))
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
            figure("throughput at batch 16 / batch 1 (fp32 decode)", ratio, "x", target=8.0,
                   claim="batch 1 -> 16 might give 10-15x throughput",
                   note=f"{new_tokens} new tokens per row, one prompt repeated"),
            *([figure("throughput at batch 16 / batch 1 (bf16 decode)", bf16_ratio, "x", target=8.0,
                      claim="batch 1 -> 16 might give 10-15x throughput",
                      note="bf16 weights and activations on the CPU's bf16 instructions")]
              if bf16_ratio is not None else []),
            figure("padding waste of a batch of 8 mixed-length prompts", waste, "fraction",
                   note=f"{100 * sorted_waste:.0f}% when sorted into batches of 4 by length"),
            figure("labsupport / HF generate on the same padded batch of 8", vs_hf, "x",
                   note=f"same tokens: {same}"),
        ],
    }


# --- measuring throughput and latency against batch size (notebook 02) -------------------

CPU_BATCHES = (1, 2, 4, 8, 16, 32, 64)
GPU_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def batch_sizes(device) -> list[int]:
    """Batch sizes for the sweep: up to 64 on a CPU, 512 on a GPU.

    Introduced in notebook 02 (batching)."""
    from .hardware import pick_device
    return list(CPU_BATCHES if pick_device(device).type == "cpu" else GPU_BATCHES)


def combined_waste(batches: list[list[int]]) -> float:
    """Padding waste of several batches together (each padded to its own longest prompt):
    1 - all real tokens / all token slots. `batches`: a list of lists of prompt lengths.

    Introduced in notebook 02 (batching)."""
    slots = sum(len(b) * max(b) for b in batches if b)
    if slots == 0:
        raise LabError("combined_waste needs at least one non-empty batch of lengths.")
    return 1.0 - sum(sum(b) for b in batches) / slots


def spread_lengths(batch: int, longest: int, spread: float) -> list[int]:
    """Prompt lengths for a batch: from `longest` down to `longest` x (1 - spread), evenly.

    Introduced in notebook 02 (batching). spread 0: all equal (no padding);
    spread 1: the shortest prompt has a single token.
    """
    if not 0.0 <= spread <= 1.0:
        raise LabError(f"spread must be between 0 and 1, got {spread}.")
    if batch == 1:
        return [longest]
    return [max(1, round(longest * (1 - spread * i / (batch - 1)))) for i in range(batch)]


def prompts_of_lengths(token_ids: list[int], lengths: list[int]) -> list[list[int]]:
    """Prompts cut from one long list of ids (repeated if too short), one per length.

    Introduced in notebook 02 (batching)."""
    if not token_ids:
        raise LabError("prompts_of_lengths needs some token ids to cut prompts from.")
    longest = max(lengths)
    source = (list(token_ids) * (longest // len(token_ids) + 1))[:longest]
    return [source[:n] for n in lengths]


def measure_batch(model, prompts, new_tokens: int = 16, repeats: int = 1, warmup: int = 1) -> dict:
    """Generate `new_tokens` for every prompt of one batch (no early stop) and time it.

    Introduced in notebook 02 (batching). Returns a dict: batch, seconds (whole
    call, median), tokens_per_s (new tokens of all rows / seconds), ms_per_token
    (one decode step: the time between two tokens of one row), prefill_s, and
    padding_waste of the prompts.
    """
    from .generate import generate
    from .measure import time_fn

    results = []
    timing = time_fn(lambda: results.append(generate(model, prompts, new_tokens, eos_token_ids=())),
                     model.device, warmup=warmup, repeats=repeats)
    timed = results[warmup:]
    steps = max(new_tokens - 1, 1)
    decode = sorted(r.decode_seconds for r in timed)[len(timed) // 2]
    prefill_s = sorted(r.prefill_seconds for r in timed)[len(timed) // 2]
    batch = len(prompts)
    return {"batch": batch, "seconds": timing.median, "tokens_per_s": batch * new_tokens / timing.median,
            "ms_per_token": 1e3 * decode / steps, "prefill_s": prefill_s,
            "padding_waste": padding_waste([len(p) for p in prompts])}


def sweep_batch_sizes(model, prompt: list[int], batches, new_tokens: int = 16, repeats: int = 1,
                      progress=None) -> list[dict]:
    """`measure_batch` for the same prompt repeated `batch` times, at each batch size.

    Introduced in notebook 02 (batching). Small batches get a warm-up call;
    larger ones are timed once as they come on a CPU (slow there; warmed up on a GPU).
    """
    rows = []
    for batch in batches:
        if progress is not None:
            progress(f"batch {batch}...")
        rows.append(measure_batch(model, [prompt] * batch, new_tokens, repeats=repeats,
                                  warmup=1 if batch <= 4 or model.device.type != "cpu" else 0))
    return rows


def scaling_stops_at(rows: list[dict], efficiency: float = 0.5) -> int | None:
    """The smallest batch whose tokens/s is below `efficiency` x (batch x batch-1 tokens/s).

    Introduced in notebook 02 (batching). Up to there extra rows are nearly free;
    from there on, each row costs real time (None: scaling held over the whole sweep).
    """
    rows = sorted(rows, key=lambda r: r["batch"])
    base = rows[0]["tokens_per_s"] / rows[0]["batch"]
    return next((r["batch"] for r in rows if r["tokens_per_s"] < efficiency * base * r["batch"]), None)


def claim_checks(loop_ratio: float, ratio_16: float, stops_at: int | None, ridge: float,
                 waste: float, sorted_waste: float, padded_over_sorted: float) -> list[dict]:
    """The handbook chapter's batching claims next to what this notebook measured.

    Introduced in notebook 02 (batching). The course target for batch 16 over
    batch 1 on a 2-core CPU is 8x; the chapter says 10-15x.
    """
    verdict_16 = "holds" if ratio_16 >= 10 else ("course target (8x) met, below the claim" if ratio_16 >= 8
                                                  else "less here")
    return [
        {"claim": "batching 4 prompts: 1.0x speedup (the chapter's code)",
         "measured": f"{loop_ratio:.2f}x: its loop runs one prompt at a time, so there is nothing to gain",
         "verdict": "reproduced, and explained"},
        {"claim": "batch 1 -> 16: 10-15x throughput",
         "measured": f"{ratio_16:.1f}x tokens/s, measured side by side", "verdict": verdict_16},
        {"claim": "small batches memory-bound, large ones compute-bound",
         "measured": (f"scaling stops near batch {stops_at}; roofline ridge at batch {ridge:.0f}"
                      if stops_at else f"scaling held over the whole sweep; roofline ridge at batch {ridge:.0f}"),
         "verdict": "holds" if stops_at else "compute-bound region not reached"},
        {"claim": "(not in the chapter) padding wastes work; sorting by length helps",
         "measured": f"{waste:.0%} of prompt slots padding, {sorted_waste:.0%} sorted; "
                     f"sorted run {padded_over_sorted:.2f}x faster", "verdict": "measured"},
    ]
