"""What one decode step reads at long context: the weights once, and every row's whole KV cache.

Introduced in notebook 08 (long context). Arithmetic only, no measurement.

A decode step at batch B and context n reads

    weights:  every weight once, shared by the B rows;
    cache:    B x n x (bytes per cached token): each row its own keys and values.

Batching divides the weights' bytes among the rows (notebook 02), but never the cache's:
each row attends to its own context. So as the context grows the cache's share of the
step grows, and past the **crossover context**

    n* = weight bytes / (B x bytes per cached token)

a step reads more cache than weights. Batch 16 brings n* 16 times closer.

Bytes per cached token = layers x 2 (K and V) x kv-heads x head_dim x bytes per value
(notebook 01's formula for one position), or with the int8 cache
(`kv_quant.Int8KVCache`) head_dim int8 bytes plus a 2-byte scale per kv-head.
Fewer kv-heads (GQA, MQA) shrink it by heads / kv-heads (`kv_head_variants`).
Multi-head latent attention (MLA, DeepSeek-V2) caches instead one compressed vector per
token per layer, from which every head's keys and values are recomputed
(`mla_bytes_per_token`).
"""

from __future__ import annotations

from ..errors import LabError
from ..engine.kv_quant import int8_kv_cache_bytes
from ..engine.config import ModelConfig

# KV precision name -> bytes per stored value (int8 adds its scales: `cache_bytes_per_token`)
KV_PRECISIONS = {"fp32": 4, "fp16/bf16": 2, "int8": 1}


def cache_bytes_per_token(config: ModelConfig, precision: str = "fp32") -> int:
    """Bytes one position of one row adds to the KV cache, in `precision` (`KV_PRECISIONS`).

    Introduced in notebook 08 (long context). "int8" counts the per-token scales
    (`kv_quant.int8_kv_cache_bytes`)."""
    if precision not in KV_PRECISIONS:
        raise LabError(f"Unknown KV precision {precision!r}; choose one of {list(KV_PRECISIONS)}.")
    if precision == "int8":
        return int8_kv_cache_bytes(config, 1, 1)
    return config.kv_values_per_token * KV_PRECISIONS[precision]


def decode_weight_bytes(config: ModelConfig, bytes_per_parameter: float) -> float:
    """Bytes of weights one decode step reads, computed from the shapes: every parameter
    but the lookup tables (the token embedding unless tied to the output layer, GPT-2's
    positions), as `Transformer.weight_bytes` counts them. Introduced in notebook 08."""
    return config.params_read_per_step * bytes_per_parameter


def step_bytes(config: ModelConfig, weight_bytes: float, context: int, batch: int = 1,
               precision: str = "fp32") -> dict:
    """The bytes one decode step reads, split: {"weights", "cache", "cache_share"}, and per
    generated token (the step makes `batch` tokens): {"weights_per_token", "cache_per_token"}.

    Introduced in notebook 08 (long context). context: positions each row's cache holds."""
    if context < 0 or batch < 1:
        raise LabError(f"Use a context of at least 0 and a batch of at least 1, got {context} and {batch}.")
    cache = batch * context * cache_bytes_per_token(config, precision)
    return {"weights": weight_bytes, "cache": cache, "cache_share": cache / (cache + weight_bytes),
            "weights_per_token": weight_bytes / batch, "cache_per_token": cache / batch}


def crossover_context(config: ModelConfig, weight_bytes: float, batch: int = 1, precision: str = "fp32") -> float:
    """The context n* at which a decode step reads as many cache bytes as weight bytes:
    weight_bytes / (batch x bytes per cached token). Introduced in notebook 08 (long context)."""
    if batch < 1:
        raise LabError(f"batch must be at least 1, got {batch}.")
    return weight_bytes / (batch * cache_bytes_per_token(config, precision))


def kv_head_variants(config: ModelConfig) -> dict[str, ModelConfig]:
    """The same shapes with full multi-head attention (a kv-head per query head), the model's
    own kv-heads, and one kv-head shared by all (multi-query): {"MHA", <own>, "MQA"}.

    Introduced in notebook 08 (long context). The model's own entry is named "GQA" when it
    has between 1 and num_heads kv-heads, else it coincides with MHA or MQA."""
    variants = {"MHA": config.with_(num_kv_heads=config.num_heads)}
    if 1 < config.num_kv_heads < config.num_heads:
        variants["GQA"] = config
    variants["MQA"] = config.with_(num_kv_heads=1)
    return variants


def mla_bytes_per_token(config: ModelConfig, latent_dim: int = 512, rope_dim: int = 64,
                        bytes_per_value: int = 2) -> int:
    """Bytes per cached token with multi-head latent attention (MLA): per layer one latent
    vector of `latent_dim` numbers (keys and values of every head are projected up from it)
    plus one rotary key of `rope_dim` shared by the heads. The defaults are DeepSeek-V2's.

    Introduced in notebook 08 (long context): in words, MLA trades a little compute per step
    (the up-projections) for a cache that does not grow with the number of heads."""
    return config.num_layers * (latent_dim + rope_dim) * bytes_per_value


def predicted_step_seconds(bytes_read: dict, bandwidth: float) -> dict:
    """Seconds of a memory-bound decode step: each part of `step_bytes` over `bandwidth`
    (bytes/s), per step and per generated token: {"weights_s", "cache_s", "total_s",
    "weights_per_token_s", "cache_per_token_s"}. Introduced in notebook 08 (long context)."""
    if not bandwidth > 0:
        raise LabError(f"bandwidth must be a positive number of bytes per second, got {bandwidth}.")
    out = {"weights_s": bytes_read["weights"] / bandwidth, "cache_s": bytes_read["cache"] / bandwidth,
           "weights_per_token_s": bytes_read["weights_per_token"] / bandwidth,
           "cache_per_token_s": bytes_read["cache_per_token"] / bandwidth}
    out["total_s"] = out["weights_s"] + out["cache_s"]
    return out
