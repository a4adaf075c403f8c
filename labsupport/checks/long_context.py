"""Checkers for notebook 08 (long context).

Introduced in notebook 08 (long context).

* `check_crossover_context` (warm-up): the context at which a decode step reads as many
  cache bytes as weight bytes;
* `check_kv_quantization`: int8 quantization of a block of keys or values with one scale
  per token per head, and its inverse.

Each compares with the package's reference (`decode_bytes.crossover_context`,
`kv_quant.quantize_per_token`) on inputs chosen so that each typical mistake gives a
different answer, and raises `CheckFailed` with a hint that names the mistake.
"""

from __future__ import annotations

import torch

from ..lab.decode_bytes import cache_bytes_per_token
from ..engine.models.config import PRESETS
from . import call_learner, close_enough, fail, grades_quietly, passed

CROSSOVER = "crossover context"
QUANTIZATION = "int8 KV quantization per token"

# --- exercise 1 (warm-up): the crossover context -------------------------------------------------

# (preset, batch, bytes per value, weight bytes): batch, layers, K-and-V and kv-heads each
# change the answer by a different factor (16, 30 or 32, 2, 3 or 4), so each slip shows
CROSSOVER_CASES = [("smollm2-135m", 1, 4, 538_000_000.0), ("smollm2-135m", 16, 4, 538_000_000.0),
                   ("llama-7b-shape", 16, 2, 13_214_000_000.0),
                   ("llama-7b-shape", 4, 2, 13_214_000_000.0)]


def _crossover_hint(ratio: float, config, batch: int) -> str:
    """Name the slip from got / expected."""
    kv_fraction = config.num_kv_heads / config.num_heads
    for factor, hint in ((batch, "every row reads its own cache: divide by batch x bytes per cached token."),
                         (2, "a cached token stores a key AND a value: layers x 2 x kv-heads x head_dim x bytes."),
                         (config.num_layers, "every layer caches its own keys and values: multiply by num_layers."),
                         (1 / 2, "the factor 2 (keys and values) belongs to the cache bytes only, once."),
                         (kv_fraction, "count the key/value heads (config.num_kv_heads), not the query heads "
                                       "(hidden_size = num_heads x head_dim counts the query heads too)."),
                         (batch * batch, "more rows bring the crossover closer: divide the weight bytes by "
                                         "batch x cache bytes per token, not multiply.")):
        if factor != 1 and close_enough(ratio, factor, rel=1e-6):
            return hint
    return ("n* = weight_bytes / (batch x layers x 2 x kv-heads x head_dim x bytes_per_value).")


@grades_quietly
def check_crossover_context(fn) -> None:
    """Check `fn(weight_bytes, config, batch, bytes_per_value)` -> the crossover context.

    Introduced in notebook 08 (long context)."""
    for name, batch, value_bytes, weight_bytes in CROSSOVER_CASES:
        config = PRESETS[name]
        per_token = cache_bytes_per_token(config, {4: "fp32", 2: "fp16/bf16"}[value_bytes])
        expected = weight_bytes / (batch * per_token)
        case = f"{name}, batch {batch}, {value_bytes}-byte values, {weight_bytes:.3g} weight bytes"
        got = call_learner(CROSSOVER, f"{expected:,.1f} tokens ({case})",
                           "use config.num_layers, config.num_kv_heads and config.head_dim.",
                           fn, weight_bytes, config, batch, value_bytes)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            fail(CROSSOVER, f"a number of tokens ({case})", type(got).__name__, "return a number (a float is fine).")
        if not close_enough(float(got), expected, rel=1e-6):
            fail(CROSSOVER, f"{expected:,.1f} tokens ({case})", f"{float(got):,.1f}",
                 _crossover_hint(float(got) / expected, config, batch))
    passed(CROSSOVER, "Past that context a decode step reads more cache than weights.")


# --- exercise 2: int8 quantization per token per head -------------------------------------------

def _test_block(generator: torch.Generator) -> torch.Tensor:
    """(batch 2, kv-heads 3, T 5, head_dim 8): T, heads and head_dim differ; one token all zero,
    one with an outlier, one whose absmax is negative."""
    x = torch.randn(2, 3, 5, 8, generator=generator) * 2.0
    x[0, 1, 2] = 0.0                                  # an all-zero token: its scale is 0
    x[1, 0, 3, 5] = 40.0                              # an outlier: only its own token's scale grows
    x[1, 2, 1, 0] = -25.0                             # the largest magnitude is negative
    return x


def _scale_hint(scales: torch.Tensor, x: torch.Tensor, want: torch.Tensor) -> str:
    """Name the slip from the shape and size of the learner's scales."""
    if scales.numel() == 1:
        return "one scale per token per head, not one for the whole tensor: amax over dim=-1, keepdim=True."
    if scales.shape == (x.shape[0], x.shape[1], 1, x.shape[3]):
        return ("that is a scale per channel over the tokens (dim=2); the scale belongs to the head_dim "
                "numbers of one token: amax over dim=-1, keepdim=True.")
    if scales.shape == want.shape[:-1]:
        return "keep the last dimension: x.abs().amax(dim=-1, keepdim=True), so scales broadcast against x."
    if scales.shape != want.shape:
        return f"scales of shape {tuple(want.shape)}: x.abs().amax(dim=-1, keepdim=True) / 127."
    ratio = (scales.float() / want.float().masked_fill(want == 0, 1)).flatten()
    if torch.allclose(ratio[want.flatten() != 0], torch.tensor(127 / 128), rtol=1e-2):
        return "divide the absmax by 127, not 128: +128 does not fit in an int8 (-128..127)."
    return "scale = x.abs().amax(dim=-1, keepdim=True) / 127: the largest magnitude of a token maps to 127."


def _check_quantized(q, scales, x: torch.Tensor, where: str) -> None:
    want_scales = x.float().abs().amax(dim=-1, keepdim=True) / 127              # (B, H, T, 1)
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
        fail(QUANTIZATION, f"q as an int8 tensor ({where})", getattr(q, "dtype", type(q).__name__),
             "round, clamp to -127..127, then .to(torch.int8): one byte per number is the point.")
    if q.shape != x.shape:
        fail(QUANTIZATION, f"q of shape {tuple(x.shape)} ({where})", tuple(q.shape), "q has x's shape.")
    if not isinstance(scales, torch.Tensor) or scales.shape != want_scales.shape or not torch.allclose(
            scales.float(), want_scales, rtol=5e-3, atol=1e-12):
        got = tuple(scales.shape) if isinstance(scales, torch.Tensor) else type(scales).__name__
        fail(QUANTIZATION, f"scales of shape {tuple(want_scales.shape)}, absmax / 127 ({where})", got,
             _scale_hint(scales, x, want_scales) if isinstance(scales, torch.Tensor) else
             "return (q, scales).")
    divisor = scales.float().masked_fill(scales.float() == 0, 1.0)
    rounded = torch.round(x.float() / divisor).clamp(-127, 127)
    if not torch.equal(q.float(), rounded):
        if torch.equal(q.float(), torch.trunc(x.float() / divisor).clamp(-127, 127)):
            fail(QUANTIZATION, f"q = round(x / scale) ({where})", "x / scale truncated toward zero",
                 "round to the nearest integer (torch.round) before .to(torch.int8); the cast alone truncates.")
        fail(QUANTIZATION, f"q = round(x / scale), clamped to -127..127 ({where})", "other integers",
             "q = torch.round(x / scales).clamp(-127, 127).to(torch.int8).")


@grades_quietly
def check_kv_quantization(quantize, dequantize, real_keys: torch.Tensor | None = None) -> None:
    """Check `quantize(x) -> (q, scales)` and `dequantize(q, scales) -> x_hat` for keys or values
    x of shape (batch, kv_heads, T, head_dim): int8 q, one scale per token per head.

    Introduced in notebook 08 (long context). real_keys: optionally, keys from the model's own
    cache, checked the same way (their outliers are real ones)."""
    blocks = {"a test block with a zero token and an outlier": _test_block(torch.Generator().manual_seed(0))}
    if real_keys is not None:
        blocks["the model's own keys"] = real_keys.detach().float().cpu()
    for where, x in blocks.items():
        out = call_learner(QUANTIZATION, f"(q, scales) for x of shape {tuple(x.shape)}",
                           lambda e: ("an all-zero token has scale 0: divide by 1 there (masked_fill) instead of 0."
                                      if "zero" in str(e).lower() else "quantize(x) must return (q, scales)."),
                           quantize, x.clone())
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            fail(QUANTIZATION, "a pair (q, scales)", type(out).__name__, "end quantize with `return q, scales`.")
        q, scales = out
        if isinstance(q, torch.Tensor) and q.is_floating_point() and torch.isnan(q).any():
            fail(QUANTIZATION, f"no NaN in q ({where})", "NaN", "an all-zero token has scale 0: divide by 1 there "
                 "(scales.masked_fill(scales == 0, 1)) instead of computing 0 / 0.")
        _check_quantized(q, scales, x, where)
        back = call_learner(QUANTIZATION, "x_hat from dequantize(q, scales)", "dequantize(q, scales) = q * scales, "
                            "in float.", dequantize, q.clone(), scales.clone())
        if not isinstance(back, torch.Tensor) or not back.is_floating_point() or back.shape != x.shape:
            fail(QUANTIZATION, f"a float tensor of shape {tuple(x.shape)}", getattr(back, "dtype", type(back).__name__),
                 "dequantize: q.float() * scales (an int8 times a scale is not an int8).")
        error = (back.float() - x).abs()
        if torch.isnan(back).any() or not torch.all(error <= scales.float() / 2 + 1e-5 * x.abs().max()):
            fail(QUANTIZATION, f"x_hat within half a scale of x ({where})",
                 f"an error of up to {error.nan_to_num(float('inf')).max().item():.3g}",
                 "dequantize multiplies: x_hat = q.float() * scales.")
    passed(QUANTIZATION, "Each token's head_dim numbers now cost one byte each, plus one scale.")
