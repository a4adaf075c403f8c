"""Measuring decode at long context: where a step's time goes, fewer kv-heads, the int8 cache,
and the sliding window's effect on quality.

Introduced in notebook 08 (long context).

The decode measurements never run a long prompt through the model: a cache is filled with
random keys and values (`step_timing.filled_cache`) and one decode step is timed on top of it
and rolled back (`step_timing.step_runner`). What the
numbers are does not change the time a step takes, and filling 16 rows x 2048 positions
by a real prefill would take minutes on a CPU. The quality measurements use the real model
and the evaluation text (`quality.eval_tokens`), in one forward pass each.

Sliding-window attention (`Transformer.with_attention_window`: the model's
`config.attention_window`) is a mask, not a smaller cache: the cache keeps
every position and each query sees only the last W of them. That keeps the `KVCache`
protocol, the positions (RoPE) and every other notebook's code unchanged, and with W at least
the context it is exactly the plain path. A serving engine would also free what the window
no longer sees (a ring buffer of W positions); the memory that saves is computed here
(`window_cache_bytes`), not allocated.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import LabError
from ..inputs import whole_number
from ..engine.hardware import as_dtype
from ..engine.generation import generate
from ..engine.kv_cache import StaticKVCache, kv_cache_bytes
from ..engine.kv_quant import Int8KVCache
from .measure import time_side_by_side
from .quality import kl_divergence_from_logits, perplexity_from_logits, top1_agreement_from_logits
from ..engine.config import ModelConfig
from ..weights.fixtures import random_model
from ..engine.models.transformer import Transformer
from .step_timing import CACHE_KINDS, filled_cache, step_runner
from .timing_model import capped, sweep_budget
from .workloads import LONG_CONTEXT_PRESETS


# --- building blocks ------------------------------------------------------------------------

def random_weights_model(config: ModelConfig, device="cpu", dtype: torch.dtype = torch.float32,
                         seed: int = 0) -> Transformer:
    """A `Transformer` of any config with seeded random weights (std 0.02, norms at 1): for
    timing and bytes only, never for text. Introduced in notebook 08 (long context)."""
    return random_model(config, seed=seed, device=device, dtype=dtype, layout=False)


def _attention_only(model, cache, batch: int):
    """The step's attention alone: every layer's `scaled_dot_product_attention` of one query
    per row over a float cache (the same shapes as inside the step)."""
    config = model.config
    q = torch.randn(batch, config.num_heads, 1, config.head_dim, device=model.device, dtype=model.dtype)
    end = cache.length + 1

    def run():
        with torch.inference_mode():
            for layer in range(config.num_layers):
                k, v = cache.keys[layer, :, :, :end], cache.values[layer, :, :, :end]    # (B, kv, end, D)
                F.scaled_dot_product_attention(q, k, v, enable_gqa=config.num_kv_heads != config.num_heads)
    return run


# --- where a decode step's time goes ------------------------------------------------------------

def contexts_that_fit(config, contexts: Sequence[int], batch: int, dtype, budget_bytes: int) -> list[int]:
    """`contexts`, each capped at the longest context (a power of two) whose cache of `batch` rows
    fits `budget_bytes` with room for one more position; sorted, without repeats.
    Introduced in notebook 08 (long context)."""
    per_position = kv_cache_bytes(config, 1, batch, dtype)
    longest = budget_bytes // per_position - 1                   # positions that fit, less the step's own
    if longest < 1:
        raise LabError(f"A cache of {batch} rows of {config.name} needs {per_position / 2**20:.1f} MiB per "
                       f"position: not even one fits the {budget_bytes / 2**20:.0f} MiB budget.")
    cap = 1 << (longest.bit_length() - 1)                        # the largest power of two <= longest
    return sorted({min(context, cap) for context in contexts})


def share_budget(device) -> int:
    """The bytes `decode_attention_share`'s caches may take: `timing_model.sweep_budget` on a GPU (a
    share of the free memory), the CPU preset's ``cache_budget_bytes`` elsewhere (768 MiB: Binder's
    2 GiB holds it beside the model). Introduced in notebook 08 (long context)."""
    budget = sweep_budget(device)
    return LONG_CONTEXT_PRESETS["cpu"].cache_budget_bytes if budget is None else budget


def decode_attention_share(model, contexts: Sequence[int], batches: Sequence[int] = (1, 16),
                           repeats: int = 3, budget_bytes: int | None = None) -> list[dict]:
    """Time one decode step and its attention alone, side by side, at each (batch, context).

    Introduced in notebook 08 (long context). The cache holds random values (see the module
    docstring). Rows: batch, context, step_s, attention_s (medians), attention_share
    (attention_s / step_s), weight_bytes and cache_bytes (what the step reads), and timings
    ({"step_s", "attention_s": Timing.to_dict()}). Each cache fits `budget_bytes` (None:
    `share_budget`): a context too long for it at a batch is cut to one that fits
    (`contexts_that_fit`), and the returned `timing_model.Sweep`'s ``note`` says which.
    """
    rows, cut = [], []
    weight_bytes = model.weight_bytes()
    budget = share_budget(model.device) if budget_bytes is None else budget_bytes
    for batch in sorted(set(batches)):
        fitting = contexts_that_fit(model.config, contexts, batch, model.dtype, budget)
        if max(fitting) < max(contexts):
            cut.append(f"batch {batch}: contexts over {max(fitting)} cut to {max(fitting)}")
        for context in fitting:
            cache = filled_cache(model, batch, context)
            steps = {"step_s": step_runner(model, cache),
                     "attention_s": _attention_only(model, cache, batch)}
            timings = time_side_by_side(steps, model.device, warmup=1, repeats=repeats)
            rows.append({"batch": batch, "context": context, "step_s": timings["step_s"].median,
                         "attention_s": timings["attention_s"].median,
                         "attention_share": timings["attention_s"].median / timings["step_s"].median,
                         "weight_bytes": weight_bytes,
                         "cache_bytes": kv_cache_bytes(model.config, context, batch, model.dtype),
                         "timings": {name: t.to_dict() for name, t in timings.items()}})
            del cache
    note = (f"Contexts cut to fit {budget / 2**20:,.0f} MiB of cache: " + ", ".join(cut) + ".") if cut else None
    return capped(rows, note)


def batch_that_fits(configs: Sequence[ModelConfig], context: int, device, largest: int = 16,
                    budget_bytes: int | None = None, dtype: torch.dtype = torch.float32,
                    new_models: bool = False) -> int:
    """The largest batch, a power of two up to `largest`, at which one cache of `context` positions
    per config in `configs`, all alive at once (timed side by side), fits in `budget_bytes`
    (None: half of the GPU's free memory now, `torch.cuda.mem_get_info`; a CPU needs a budget).
    new_models: the configs' models are built for the timing (`time_kv_variants`), so their
    weights in `dtype` come out of the budget too; a model already loaded is in the free memory.
    1 when even that does not fit: the step is then timed at batch 1, never out of memory.
    Introduced in notebook 08 (long context): a T4's 15 GiB cannot hold three fp32 caches of
    8,000 positions at batch 16 (23.8 GiB)."""
    device = torch.device(device)
    if budget_bytes is None:
        if device.type != "cuda":
            raise LabError("batch_that_fits needs budget_bytes on a CPU (the workload preset's cache_budget_bytes).")
        budget_bytes = torch.cuda.mem_get_info(device)[0] // 2       # (free, total) bytes
    itemsize = torch.empty((), dtype=dtype).element_size()
    weights = sum(c.num_parameters for c in configs) * itemsize if new_models else 0
    per_row = sum(kv_cache_bytes(config, context + 1, 1, dtype) for config in configs)
    if new_models and device.type == "cuda" and weights + per_row > budget_bytes:
        raise LabError(f"{len(configs)} models of this shape ({weights / 2**30:.1f} GiB of {dtype} weights) and their "
                       f"caches at batch 1 do not fit in {budget_bytes / 2**30:.1f} GiB of this GPU; time them in "
                       f"16-bit (dtype=torch.float16) or with a smaller LABSUPPORT_MODEL.")
    batch = 1 << (max(1, largest).bit_length() - 1)
    while batch > 1 and weights + batch * per_row > budget_bytes:
        batch //= 2
    return batch


def time_kv_variants(variants: dict[str, ModelConfig], context: int, batch: int = 1, device="cpu",
                     dtype: torch.dtype = torch.float32, repeats: int = 3) -> list[dict]:
    """One decode step and its attention, at `context`, for each config of `variants`
    (`long_context_bytes.kv_head_variants`: MHA, GQA, MQA), all timed side by side.

    Introduced in notebook 08 (long context). Each variant is a `Transformer` with random
    weights (`random_weights_model`): the same shapes but for the kv-heads, so only the cache
    and the key/value projections differ. Rows: variant, kv_heads, cache_bytes,
    weight_bytes, step_s, attention_s, timings.
    """
    models = {name: random_weights_model(config, device, dtype) for name, config in variants.items()}
    caches = {name: filled_cache(model, batch, context) for name, model in models.items()}
    steps = {}
    for name, model in models.items():
        steps[f"{name} step"] = step_runner(model, caches[name])
        steps[f"{name} attention"] = _attention_only(model, caches[name], batch)
    timings = time_side_by_side(steps, device, warmup=1, repeats=repeats)
    return [{"variant": name, "kv_heads": config.num_kv_heads,
             "cache_bytes": kv_cache_bytes(config, context, batch, dtype),
             "weight_bytes": models[name].weight_bytes(),
             "step_s": timings[f"{name} step"].median, "attention_s": timings[f"{name} attention"].median,
             "timings": {part: timings[f"{name} {part}"].to_dict() for part in ("step", "attention")}}
            for name, config in variants.items()]


def time_cache_kinds(model, context: int, batch: int = 1, repeats: int = 3) -> dict:
    """One decode step with the float cache and with the int8 cache at `context`, side by side.

    Introduced in notebook 08 (long context). Returns {"context", "batch", "float_s",
    "int8_s", "float_bytes", "int8_bytes" (allocated), "timings"}."""
    caches = {kind: filled_cache(model, batch, context, kind) for kind in CACHE_KINDS}
    steps = {f"{kind}_s": step_runner(model, cache) for kind, cache in caches.items()}
    timings = time_side_by_side(steps, model.device, warmup=1, repeats=repeats)
    return {"context": context, "batch": batch, **{name: t.median for name, t in timings.items()},
            "float_bytes": caches["float"].nbytes, "int8_bytes": caches["int8"].nbytes,
            "timings": {name: t.to_dict() for name, t in timings.items()}}


# --- quality: the int8 cache and the window ---------------------------------------------------


@torch.inference_mode()
def _logits(model, tokens: Sequence[int], cache_kind: str | None = None) -> torch.Tensor:
    """Logits (T, vocab) in float32 of one forward pass over `tokens`, through a cache of
    `cache_kind` (whose keys and values the pass then attends to) or none."""
    ids = torch.as_tensor(list(tokens), device=model.device).reshape(1, -1)     # (1, T)
    cache = None
    if cache_kind is not None:
        cache_class = StaticKVCache if cache_kind == "float" else Int8KVCache
        cache = cache_class.for_model(model, 1, ids.shape[1])
    return model.logits(model(ids, cache=cache))[0].float()                     # (T, vocab)


def kv_precision_quality(model, tokens: Sequence[int]) -> dict:
    """The int8 cache against the float cache on `tokens` (the evaluation text, say): one
    forward pass each, every position attending through its cache.

    Introduced in notebook 08 (long context). Returns perplexity of each ("float_ppl",
    "int8_ppl"), the largest logit difference relative to the largest logit
    ("relative_logit_difference"), the fraction of positions whose top token agrees
    ("top1_agreement") and the mean KL divergence of the int8 cache's next-token distribution
    from the float cache's, in nats per position ("kl_divergence")."""
    if len(tokens) < 2:
        raise LabError("kv_precision_quality needs at least 2 tokens.")
    float_logits, int8_logits = _logits(model, tokens, "float"), _logits(model, tokens, "int8")
    return {"tokens": len(tokens), "float_ppl": perplexity_from_logits(float_logits, list(tokens)),
            "int8_ppl": perplexity_from_logits(int8_logits, list(tokens)),
            "relative_logit_difference": ((int8_logits - float_logits).abs().max()
                                          / float_logits.abs().max()).item(),
            "top1_agreement": top1_agreement_from_logits(float_logits, int8_logits),
            "kl_divergence": kl_divergence_from_logits(float_logits, int8_logits)}


def generation_agreement(model, prompt_ids: Sequence[int], new_tokens: int = 32) -> dict:
    """Greedy generation with the float cache and with the int8 cache: the short-context
    invariant. Introduced in notebook 08 (long context).

    Returns "same_tokens" (fraction of steps whose token agrees, up to the first difference
    and after it: position by position), "first_difference" (index or None) and
    "relative_logit_difference" (largest difference over the steps before the first
    different token, relative to the largest logit there)."""
    runs = {}
    for kind, cache_class in (("float", StaticKVCache), ("int8", Int8KVCache)):
        cache = cache_class.for_model(model, 1, len(prompt_ids) + new_tokens)
        runs[kind] = generate(model, list(prompt_ids), new_tokens, eos_token_ids=(), return_logits=True,
                              cache=cache, compile=False)
    ids = {kind: run.row(0) for kind, run in runs.items()}
    first = next((i for i, (a, b) in enumerate(zip(ids["float"], ids["int8"])) if a != b), None)
    shared = new_tokens if first is None else first + 1        # logits up to the first difference compare
    float_logits = torch.cat(runs["float"].logits[:shared])                     # (shared, vocab)
    int8_logits = torch.cat(runs["int8"].logits[:shared])
    return {"new_tokens": new_tokens, "first_difference": first,
            "same_tokens": sum(a == b for a, b in zip(ids["float"], ids["int8"])) / new_tokens,
            "relative_logit_difference": ((int8_logits - float_logits).abs().max()
                                          / float_logits.abs().max()).item()}


def window_cache_bytes(config: ModelConfig, context: int, window: int | None, batch: int = 1,
                       dtype: torch.dtype = torch.float32) -> int:
    """Bytes a cache needs at `context` when it keeps only the last `window` positions (a
    ring buffer; None: every position): computed, not allocated. Whole numbers (NumPy and
    torch integers too) of at least 1. Introduced in notebook 08 (long context)."""
    if not isinstance(config, ModelConfig):
        raise LabError(f"config must be a ModelConfig (model.config), got {type(config).__name__}.")
    context = whole_number(context, "context (positions so far)")
    if window is not None:
        window = whole_number(window, "window (positions the sliding window keeps, or None for all)")
    batch = whole_number(batch, "batch (rows of the cache)")
    kept = context if window is None else min(context, window)
    return kv_cache_bytes(config, kept, batch, as_dtype(dtype))


def window_perplexity(model, tokens: Sequence[int], windows: Sequence[int | None]) -> list[dict]:
    """Perplexity of `tokens` with each sliding window (None: full attention), one forward
    pass each. Introduced in notebook 08 (long context).

    Rows: window, perplexity, cache_bytes (a ring buffer of the window at this length,
    computed) and full_cache_bytes."""
    rows = []
    for window in windows:
        perplexity = perplexity_from_logits(_logits(model.with_attention_window(window), tokens), list(tokens))
        rows.append({"window": window, "perplexity": perplexity,
                     "cache_bytes": window_cache_bytes(model.config, len(tokens), window, dtype=model.dtype),
                     "full_cache_bytes": kv_cache_bytes(model.config, len(tokens), 1, model.dtype)})
    return rows


# --- decode attention's arithmetic intensity, and how keys and values quantize ---------------

def decode_attention_intensity(config: ModelConfig, bytes_per_value: int = 2, latent_dim: int = 512,
                               rope_dim: int = 64) -> dict[str, float]:
    """FLOPs per byte of cache that one decode step's attention does, per layer and cached token,
    for MHA, this config's GQA, MQA and MLA. Introduced in notebook 08 (long context).

    With separate keys and values a query head does 2 x head_dim FLOPs on a key (q . k) and as
    many on a value (p x v), so the heads that share one kv-head (heads / kv_heads of them) do
    4 x head_dim x heads / kv_heads FLOPs on 2 x head_dim x bytes: 2 x heads / kv_heads / bytes.
    MLA, with its up-projections folded into the query and output ones, lets every head attend
    over the same latent (latent_dim + rope_dim numbers read once): each head does
    2 x (latent_dim + rope_dim) FLOPs for the score and 2 x latent_dim for the output, on bytes
    that all heads share, so the intensity grows with the number of heads."""
    heads = config.num_heads
    rows = {f"MHA ({heads} kv-heads)": 2 * heads / heads / bytes_per_value,
            f"GQA ({config.num_kv_heads} kv-heads)": 2 * heads / config.num_kv_heads / bytes_per_value,
            "MQA (1 kv-head)": 2 * heads / bytes_per_value}
    flops = heads * (2 * (latent_dim + rope_dim) + 2 * latent_dim)
    rows[f"MLA (latent {latent_dim} + rope {rope_dim})"] = flops / ((latent_dim + rope_dim) * bytes_per_value)
    return rows


def _round_trip(x: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Symmetric absmax quantization to `bits` with one scale per slice along `dim`, and back."""
    levels = 2 ** (bits - 1) - 1
    scales = x.abs().amax(dim=dim, keepdim=True) / levels
    scales = scales.masked_fill(scales == 0, 1.0)
    return torch.round(x / scales).clamp(-levels, levels) * scales


def kv_grouping_errors(keys: torch.Tensor, values: torch.Tensor, bits: Sequence[int] = (8, 4, 2)) -> list[dict]:
    """Mean relative rounding error of keys and values quantized per token (one scale for the
    head_dim numbers of a token) and per channel (one scale for a channel over the tokens), at
    each bit width. Introduced in notebook 08 (long context).

    keys, values: (batch, kv_heads, T, head_dim) from the model's own cache. Rows: tensor
    ("keys" or "values"), bits, per_token and per_channel (mean |x_hat - x| / mean |x|), and
    outlier_ratio (the largest channel's max |x| over the median channel's, the median over
    batch and heads). A scale per channel here spans all T tokens; KIVI's spans a group of them. KIVI (Liu et al.
    2024) quantizes keys per channel, since a few key channels are large for every token, and
    values per token; labsupport's `Int8KVCache` uses one scale per token for both."""
    rows = []
    for name, x in (("keys", keys.float()), ("values", values.float())):
        channel_max = x.abs().amax(dim=2)                                              # (B, H, head_dim)
        ratio = (channel_max.amax(dim=-1) / channel_max.median(dim=-1).values.clamp(min=1e-12)).median().item()
        size = x.abs().mean().clamp(min=1e-12)
        for b in bits:
            rows.append({"tensor": name, "bits": b, "outlier_ratio": ratio,
                         "per_token": ((_round_trip(x, b, -1) - x).abs().mean() / size).item(),
                         "per_channel": ((_round_trip(x, b, 2) - x).abs().mean() / size).item()})
    return rows
