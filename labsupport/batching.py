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
    # the headline ratio: batch 16 against batch 1, interleaved
    pair = time_side_by_side({"batch 1": run(1), "batch 16": run(16)}, ctx.device, warmup=1,
                             repeats=options.get("repeats", 3))
    ratio = (16 * new_tokens / pair["batch 16"].median) / (new_tokens / pair["batch 1"].median)

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
        "batch16_over_batch1": ratio, "timings_s": {k: v.to_dict() for k, v in pair.items()},
        "padding": {"lengths": [len(p) for p in prompts], "waste": waste, "sorted_waste": sorted_waste},
        "vs_huggingface": {"speedup": vs_hf, "same_tokens": same,
                           "timings_s": {k: v.to_dict() for k, v in side.items()}},
        "figures": [
            figure("throughput at batch 16 / batch 1 (fp32 decode)", ratio, "x", target=8.0,
                   claim="batch 1 -> 16 might give 10-15x throughput",
                   note=f"{new_tokens} new tokens per row, one prompt repeated"),
            figure("padding waste of a batch of 8 mixed-length prompts", waste, "fraction",
                   note=f"{100 * sorted_waste:.0f}% when sorted into batches of 4 by length"),
            figure("labsupport / HF generate on the same padded batch of 8", vs_hf, "x",
                   note=f"same tokens: {same}"),
        ],
    }
