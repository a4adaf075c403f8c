"""Checker cases of notebook 08 (long context): the reference and each typical mistake."""

import importlib
import math

import torch

from labsupport.checks import long_context, long_context_tiled
from labsupport.checks.long_context import check_int8_crossover
from labsupport.checks.long_context_tiled import check_tiled_attention
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.engine.kv_quant import Int8KVCache, int8_kv_cache_bytes
from labsupport.engine.models.masks import causal_mask
from labsupport.lab import long_context_bytes
from labsupport.lab.long_context_prefill import fused_attention
from labsupport.lab.long_context_prefill import tiled_attention as package_tiled

from checker_cases.common import accepts, refuses


# --- exercise 2 (warm-up): the crossover context of the int8 cache ------------------------------

def position_bytes(config, values=1, scale=2, kv=None, per_value=False):
    kv = config.num_kv_heads if kv is None else kv
    per_head = config.head_dim * (values + scale) if per_value else config.head_dim * values + scale
    return config.num_layers * 2 * kv * per_head


def reference_crossover(weight_bytes, config, batch):
    return weight_bytes / (batch * position_bytes(config))


def crossover_without_scales(weight_bytes, config, batch):
    return weight_bytes / (batch * position_bytes(config, scale=0))


def crossover_scale_per_value(weight_bytes, config, batch):
    return weight_bytes / (batch * position_bytes(config, per_value=True))


def crossover_fp32_scale(weight_bytes, config, batch):
    return weight_bytes / (batch * position_bytes(config, scale=4))


def crossover_one_scale_per_token(weight_bytes, config, batch):
    per_token = config.num_layers * 2 * (config.num_kv_heads * config.head_dim + 2)
    return weight_bytes / (batch * per_token)


def crossover_query_heads(weight_bytes, config, batch):
    return weight_bytes / (batch * position_bytes(config, kv=config.num_heads))


def crossover_fp16_formula(weight_bytes, config, batch):      # the cell above's 16-bit cache, unchanged
    return weight_bytes / (batch * position_bytes(config, values=2, scale=0))


def crossover_without_batch(weight_bytes, config, batch):
    return reference_crossover(weight_bytes, config, 1)


def crossover_times_batch(weight_bytes, config, batch):
    return reference_crossover(weight_bytes, config, 1) * batch


def crossover_one_layer(weight_bytes, config, batch):
    return config.num_layers * reference_crossover(weight_bytes, config, batch)


def crossover_as_text(weight_bytes, config, batch):
    return f"{reference_crossover(weight_bytes, config, batch):.0f}"


# the package's count of the same bytes, however the learner's function holds it

def crossover_by_default(weight_bytes, config, batch, _bytes=int8_kv_cache_bytes):
    return weight_bytes / _bytes(config, 1, batch)


def _closure_over_the_cache():
    cache_class = Int8KVCache

    def crossover(weight_bytes, config, batch):
        return weight_bytes / (batch * cache_class(config, 1, 1).nbytes)
    return crossover


def _values_bytes(config):
    return kv_cache_bytes(config, 1, 1, torch.int8)                  # the int8 values, without their scales


def crossover_by_a_helper(weight_bytes, config, batch):
    scales = config.num_layers * 2 * config.num_kv_heads * 2
    return weight_bytes / (batch * (_values_bytes(config) + scales))


def crossover_by_the_configs_count(weight_bytes, config, batch):
    scales = config.num_layers * 2 * config.num_kv_heads * 2
    return weight_bytes / (batch * (config.kv_values_per_token + scales))


def crossover_by_the_checkers_table(weight_bytes, config, batch):
    return weight_bytes / (batch * long_context.POSITION_BYTES[0][0](config))


def crossover_by_the_labs_copy(weight_bytes, config, batch):
    return long_context_bytes.crossover_context(config, weight_bytes, batch, "int8")


def crossover_by_a_built_name(weight_bytes, config, batch):
    module = importlib.import_module("labsupport.engine.kv_quant")
    return weight_bytes / getattr(module, "int8_kv_cache" + "_bytes")(config, 1, batch)


# --- exercise 1: tiled attention with an online softmax -----------------------------------------

def reference_tiled(q, k, v, tile, causal=False, first_query=0):            # the notebook's solution
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # (B, H, Tk, d)
    row_max = torch.full(q.shape[:-1] + (1,), float("-inf"))                  # (B, H, Tq, 1)
    row_sum = torch.zeros(q.shape[:-1] + (1,))
    out = torch.zeros_like(q)
    for start in range(0, k.shape[2], tile):
        scores = q @ k[:, :, start:start + tile].transpose(-2, -1) / math.sqrt(q.shape[-1])   # (B, H, Tq, t)
        if causal:
            keys = torch.arange(start, start + scores.shape[-1])
            queries = first_query + torch.arange(q.shape[2])[:, None]
            scores = scores.masked_fill(keys[None, :] > queries, float("-inf"))
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        safe = torch.where(new_max == float("-inf"), 0.0, new_max)
        weights = torch.exp(scores - safe)
        rescale = torch.exp(row_max - safe)
        row_sum = row_sum * rescale + weights.sum(dim=-1, keepdim=True)
        out = out * rescale + weights @ v[:, :, start:start + tile]
        row_max = new_max
    return out / row_sum


def query_blocks(q, k, v, tile, causal=False):
    """FlashAttention-2's order: a block of queries at a time, each walking the key tiles, the
    tiles wholly in the block's future skipped."""
    outs = []
    for q_start in range(0, q.shape[2], tile):
        block = q[:, :, q_start:q_start + tile]                               # (B, H, tq, d)
        keys_end = min(k.shape[2], q_start + block.shape[2]) if causal else k.shape[2]
        part = reference_tiled(block, k[:, :, :keys_end], v[:, :, :keys_end], tile, causal=False) if not causal \
            else _causal_block(block, k[:, :, :keys_end], v[:, :, :keys_end], tile, q_start)
        outs.append(part)
    return torch.cat(outs, dim=2)                                             # (B, H, Tq, d)


def _causal_block(block, k, v, tile, q_start):
    return reference_tiled(block, k, v, tile, causal=True, first_query=q_start)   # (B, H, tq, d)


def _tiled_with(slip):
    """The reference with one learner's slip."""
    def tiled(q, k, v, tile, causal=False):
        group = q.shape[1] // k.shape[1]
        if slip == "gqa-repeat":
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)         # (B, H, Tk, d), heads in the wrong order
        else:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        row_max = torch.full(q.shape[:-1] + (1,), float("-inf"))
        row_sum, out = torch.zeros(q.shape[:-1] + (1,)), torch.zeros_like(q)
        scale = 1.0 if slip == "no-scale" else 1 / math.sqrt(q.shape[-1])
        stop = (k.shape[2] // tile) * tile if slip == "floor-tiles" else k.shape[2]
        for start in range(0, stop, tile):
            scores = q @ k[:, :, start:start + tile].transpose(-2, -1) * scale
            if causal or slip == "always-causal":
                keys = torch.arange(start, start + scores.shape[-1])[None, :]
                rows = torch.arange(q.shape[2])[:, None]
                future = keys >= rows if slip == "strict-mask" else keys > rows + (1 if slip == "one-ahead" else 0)
                scores = scores.masked_fill(future, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            safe = torch.where(new_max == float("-inf"), 0.0, new_max)
            weights = torch.exp(scores - safe)
            rescale = torch.exp(row_max - safe)
            row_sum = (row_sum if slip == "sum-not-rescaled" else row_sum * rescale) + weights.sum(-1, keepdim=True)
            out = (out if slip == "out-not-rescaled" else out * rescale) + weights @ v[:, :, start:start + tile]
            row_max = new_max
        return out if slip == "no-division" else out / row_sum
    return tiled


def naive_scores(q, k, v, tile, causal=False):                              # right numbers, T x T scores
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])                 # (B, H, Tq, Tk)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(dim=-1) @ v


def full_mask(q, k, v, tile, causal=False):                                 # tiles, but a T x T mask
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()       # (Tq, Tk)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    row_max = torch.full(q.shape[:-1] + (1,), float("-inf"))
    row_sum, out = torch.zeros(q.shape[:-1] + (1,)), torch.zeros_like(q)
    for start in range(0, k.shape[2], tile):
        scores = q @ k[:, :, start:start + tile].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            scores = scores.masked_fill(~mask[:, start:start + tile], float("-inf"))
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        weights, rescale = torch.exp(scores - new_max), torch.exp(row_max - new_max)
        row_sum = row_sum * rescale + weights.sum(-1, keepdim=True)
        out = out * rescale + weights @ v[:, :, start:start + tile]
        row_max = new_max
    return out / row_sum


def row_by_row(q, k, v, tile, causal=False):                                # exact softmax, one query at a time
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    rows = []
    for i in range(q.shape[2]):
        scores = q[:, :, i:i + 1] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (B, H, 1, Tk)
        if causal:
            scores[..., i + 1:] = float("-inf")
        rows.append(scores.softmax(dim=-1) @ v)
    return torch.cat(rows, dim=2)


def calls_sdpa(q, k, v, tile, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def tiles_by_reshape(q, k, v, tile, causal=False):                          # assumes Tk % tile == 0
    k.reshape(k.shape[0], k.shape[1], -1, tile, k.shape[3])                   # (B, kv, Tk / tile, tile, d)
    return reference_tiled(q, k, v, tile, causal)


def returns_pair(q, k, v, tile, causal=False):
    return reference_tiled(q, k, v, tile, causal), None


def _scores_of(q, k, start, tile, causal):
    scores = q @ k[:, :, start:start + tile].transpose(-2, -1) / math.sqrt(q.shape[-1])    # (B, H, Tq, t)
    if causal:
        keys = torch.arange(start, start + scores.shape[-1])[None, :]
        scores = scores.masked_fill(keys > torch.arange(q.shape[2])[:, None], float("-inf"))
    return scores


def two_pass_kept(q, k, v, tile, causal=False):
    """The right numbers in two walks, each score computed once: every tile's scores kept in a list while
    the first walk takes the max, then the sum and output from the list."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    kept, row_max = [], torch.full(q.shape[:-1] + (1,), float("-inf"))
    for start in range(0, k.shape[2], tile):
        kept.append(_scores_of(q, k, start, tile, causal))
        row_max = torch.maximum(row_max, kept[-1].amax(dim=-1, keepdim=True))
    row_sum, out = torch.zeros(q.shape[:-1] + (1,)), torch.zeros_like(q)
    for start, scores in zip(range(0, k.shape[2], tile), kept):
        weights = torch.exp(scores - row_max)
        row_sum, out = row_sum + weights.sum(dim=-1, keepdim=True), out + weights @ v[:, :, start:start + tile]
    return out / row_sum


def two_pass_recomputed(q, k, v, tile, causal=False):
    """The right numbers in two walks that compute every score twice: the max first, then the sum and output."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    row_max = torch.full(q.shape[:-1] + (1,), float("-inf"))
    for start in range(0, k.shape[2], tile):
        row_max = torch.maximum(row_max, _scores_of(q, k, start, tile, causal).amax(dim=-1, keepdim=True))
    row_sum, out = torch.zeros(q.shape[:-1] + (1,)), torch.zeros_like(q)
    for start in range(0, k.shape[2], tile):
        weights = torch.exp(_scores_of(q, k, start, tile, causal) - row_max)
        row_sum, out = row_sum + weights.sum(dim=-1, keepdim=True), out + weights @ v[:, :, start:start + tile]
    return out / row_sum


# the package's attention, however the learner's function holds it

def tiled_by_default(q, k, v, tile, causal=False, _tiled=package_tiled):
    return _tiled(q, k, v, tile, causal=causal)


def _closure_over_the_fused():
    fused = fused_attention

    def tiled(q, k, v, tile, causal=False):
        return fused(q, k, v) if causal else reference_tiled(q, k, v, tile)
    return tiled


def _one_tile(q, k, v, causal):
    mask = causal_mask(q.shape[2], 0, None, q.device, window=None)           # the engine's causal mask
    return reference_tiled(q, k, v, k.shape[2], causal=mask == "causal")


def tiled_by_a_helper(q, k, v, tile, causal=False):
    return _one_tile(q, k, v, causal)


def tiled_by_the_checkers_slip(q, k, v, tile, causal=False):
    return long_context_tiled._slipped(q, k, v, tile, causal).float()       # its slip "": the online softmax


def tiled_by_a_built_name(q, k, v, tile, causal=False):
    module = importlib.import_module("labsupport.lab.long_context_prefill")
    return getattr(module, "tiled" + "_attention")(q, k, v, tile, causal=causal)


OWN = "expected your own code"

# (grade id -> {mutant: why no valid input tells it from the notebook's solution}); scripts/checker_mutants.py
EQUIVALENT_MUTANTS = {
    "long-tiled-attention": {
        "16:21:swap-arguments:0<->1": "k_tile.transpose(-1, -2) swaps the same two dimensions as transpose(-2, -1)",
        "16:38:unary:drop-USub": "transpose(2, -1) on k_tile, always (batch, heads, t, d): dimension 2 is -2",
        "20:18:swap-arguments:0<->1": "torch.maximum is symmetric: maximum(tile max, row_max) is maximum(row_max, "
                                      "tile max), same shape (B, H, Tq, 1), -inf and all",
        "21:61:constant:0.0*2": "0.0 * 2 is 0.0: the same fill",
    },
}

NOTEBOOK_08 = [
    accepts(check_int8_crossover, "reference", reference_crossover),
    refuses(check_int8_crossover, "without-scales", "scales are cached too", crossover_without_scales),
    refuses(check_int8_crossover, "scale-per-value", "not 3 bytes a value", crossover_scale_per_value),
    refuses(check_int8_crossover, "fp32-scale", "2 bytes, not 4", crossover_fp32_scale),
    refuses(check_int8_crossover, "one-scale-per-token", "own scale", crossover_one_scale_per_token),
    refuses(check_int8_crossover, "query-heads", "num_kv_heads", crossover_query_heads),
    refuses(check_int8_crossover, "fp16-formula", "one byte, not two", crossover_fp16_formula),
    refuses(check_int8_crossover, "without-batch", "its own cache", crossover_without_batch),
    refuses(check_int8_crossover, "times-batch", "not multiply", crossover_times_batch),
    refuses(check_int8_crossover, "one-layer", "num_layers", crossover_one_layer),
    refuses(check_int8_crossover, "as-text", "return a number", crossover_as_text),
    refuses(check_int8_crossover, "int8_kv_cache_bytes-as-a-default", OWN, crossover_by_default),
    refuses(check_int8_crossover, "Int8KVCache-nbytes-in-a-closure", OWN, _closure_over_the_cache()),
    refuses(check_int8_crossover, "kv_cache_bytes-through-a-helper", OWN, crossover_by_a_helper),
    refuses(check_int8_crossover, "the-configs-kv_values_per_token", OWN + ".*kv_values_per_token",
            crossover_by_the_configs_count),
    refuses(check_int8_crossover, "the-checkers-slip-table", OWN, crossover_by_the_checkers_table),
    refuses(check_int8_crossover, "the-labs-crossover_context", OWN + ".*crossover_context",
            crossover_by_the_labs_copy),
    refuses(check_int8_crossover, "int8_kv_cache_bytes-by-a-built-name", OWN, crossover_by_a_built_name),
    accepts(check_tiled_attention, "reference", reference_tiled),
    accepts(check_tiled_attention, "query-blocks", query_blocks),
    refuses(check_tiled_attention, "naive-scores", "every query's score against every key", naive_scores),
    refuses(check_tiled_attention, "full-mask", "mask is as large", full_mask),
    refuses(check_tiled_attention, "row-by-row", "spans all 203 keys", row_by_row),
    refuses(check_tiled_attention, "calls-sdpa", "what this exercise rebuilds", calls_sdpa),
    refuses(check_tiled_attention, "sum-not-rescaled", "running sum was not rescaled", _tiled_with("sum-not-rescaled")),
    refuses(check_tiled_attention, "out-not-rescaled", "running output was not rescaled",
            _tiled_with("out-not-rescaled")),
    refuses(check_tiled_attention, "no-scale", "sqrt\\(head_dim\\)", _tiled_with("no-scale")),
    refuses(check_tiled_attention, "strict-mask", "itself included", _tiled_with("strict-mask")),
    refuses(check_tiled_attention, "one-ahead", "not i \\+ 1", _tiled_with("one-ahead")),
    refuses(check_tiled_attention, "always-causal", "mask only when causal", _tiled_with("always-causal")),
    refuses(check_tiled_attention, "gqa-repeat", "repeat_interleave", _tiled_with("gqa-repeat")),
    refuses(check_tiled_attention, "floor-tiles", "last tile is shorter", _tiled_with("floor-tiles")),
    refuses(check_tiled_attention, "no-division", "divide the output by the running sum", _tiled_with("no-division")),
    refuses(check_tiled_attention, "tiles-by-reshape", "the last\\s+one may be shorter", tiles_by_reshape),
    refuses(check_tiled_attention, "returns-pair", "a tensor", returns_pair),
    refuses(check_tiled_attention, "two-pass-every-tiles-scores-kept", "two-pass softmax", two_pass_kept),
    refuses(check_tiled_attention, "two-pass-scores-computed-twice", "one walk over the tiles", two_pass_recomputed),
    refuses(check_tiled_attention, "the-packages-tiled_attention", OWN, package_tiled),
    refuses(check_tiled_attention, "the-packages-tiled_attention-in-a-lambda", OWN,
            lambda q, k, v, tile, causal=False: package_tiled(q, k, v, tile, causal=causal)),
    refuses(check_tiled_attention, "the-packages-tiled_attention-as-a-default", OWN, tiled_by_default),
    refuses(check_tiled_attention, "the-labs-fused_attention-in-a-closure", OWN, _closure_over_the_fused()),
    refuses(check_tiled_attention, "the-engines-causal_mask-through-a-helper", OWN + ".*causal_mask",
            tiled_by_a_helper),
    refuses(check_tiled_attention, "the-checkers-own-slipped", OWN + ".*_slipped", tiled_by_the_checkers_slip),
    refuses(check_tiled_attention, "the-packages-tiled_attention-by-a-built-name", OWN, tiled_by_a_built_name),
]
