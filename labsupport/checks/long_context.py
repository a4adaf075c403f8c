"""Checkers for notebook 08 (long context).

Introduced in notebook 08 (long context).

* `check_crossover_context` (warm-up): the context at which a decode step reads as many
  cache bytes as weight bytes. It compares with the package's reference
  (`decode_bytes.crossover_context`) on inputs chosen so that each typical mistake gives a
  different answer, and raises `CheckFailed` with a hint that names the mistake.

The main exercise, a tiled attention with an online softmax, has its own module
(`checks.tiled_attention`). The int8 KV quantization exercise was removed: one absmax scale per
token is notebook 04's int8 warm-up (one scale per row) again.
"""

from __future__ import annotations


from ..lab.decode_bytes import cache_bytes_per_token
from ..engine.models.config import PRESETS
from . import call_learner, close_enough, fail, grades_quietly, passed

CROSSOVER = "crossover context"

# --- exercise 2 (warm-up): the crossover context -------------------------------------------------

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
