"""Checkers for notebook 08 (long context).

Introduced in notebook 08 (long context).

* `check_int8_crossover` (warm-up): the context at which a decode step reads as many bytes of
  int8 cache (values and scales) as of weights. It compares with `int8_kv_cache_bytes` on inputs
  chosen so that each typical mistake gives a different answer, and raises `CheckFailed` with a
  hint that names the mistake.

The main exercise, a tiled attention with an online softmax, has its own module
(`checks.long_context_tiled`). The int8 KV quantization exercise was removed: one absmax scale per
token is notebook 04's int8 warm-up (one scale per row) again.
"""

from __future__ import annotations


from ..engine.kv_quant import int8_kv_cache_bytes
from ..engine.config import PRESETS
from . import call_learner, close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded

CROSSOVER = "int8 cache crossover context"
SCALE_BYTES = 2          # Int8KVCache's scale: one bfloat16 per token per kv-head, for keys and for values

# --- exercise 2 (warm-up): the crossover context of the int8 cache ------------------------------

# (preset, batch, weight bytes): batch, layers, K-and-V, kv-heads and the scales each change the
# answer by a different factor, so each slip shows
CROSSOVER_CASES = [("smollm2-135m", 1, 538_000_000.0), ("smollm2-135m", 16, 538_000_000.0),
                   ("llama-7b-shape", 16, 13_214_000_000.0), ("llama-7b-shape", 4, 13_214_000_000.0)]

# Bytes of one cached position (all layers, one row), right and by each slip, with the slip's hint
POSITION_BYTES = [
    (lambda c: c.num_layers * 2 * c.num_kv_heads * (c.head_dim + SCALE_BYTES), None),
    (lambda c: c.num_layers * 2 * c.num_kv_heads * c.head_dim,
     "the scales are cached too: each token and kv-head stores a 2-byte (bfloat16) scale for its keys "
     "and one for its values."),
    (lambda c: c.num_layers * 2 * c.num_kv_heads * c.head_dim * (1 + SCALE_BYTES),
     "one scale per token per kv-head, shared by its head_dim values: head_dim int8 bytes + 2, not 3 bytes a value."),
    (lambda c: c.num_layers * 2 * c.num_kv_heads * (c.head_dim + 4), "the scale is a bfloat16: 2 bytes, not 4."),
    (lambda c: c.num_layers * 2 * (c.num_kv_heads * c.head_dim + SCALE_BYTES),
     "each kv-head of a token has its own scale: kv-heads x (head_dim + 2) per layer, keys and values."),
    (lambda c: c.num_layers * c.num_kv_heads * (2 * c.head_dim + SCALE_BYTES),
     "keys and values have a scale each: 2 x kv-heads x (head_dim + 2) per layer."),
    (lambda c: c.num_layers * 2 * c.num_kv_heads * (2 * c.head_dim + SCALE_BYTES),
     "an int8 value is one byte, not two."),
    (lambda c: c.num_layers * 2 * c.num_kv_heads * 2 * c.head_dim,
     "that is the 16-bit cache of the cell above: an int8 value is one byte, not two, plus the 2-byte "
     "scales of each token and kv-head."),
    (lambda c: c.num_layers * 2 * c.num_heads * (c.head_dim + SCALE_BYTES),
     "count the key/value heads (config.num_kv_heads), not the query heads."),
    (lambda c: c.num_layers * c.num_kv_heads * (c.head_dim + SCALE_BYTES),
     "a cached token stores a key AND a value, each with its scale: the factor 2."),
    (lambda c: 2 * c.num_kv_heads * (c.head_dim + SCALE_BYTES),
     "every layer caches its own keys and values: multiply by num_layers."),
]


def _crossover_hint(got: float, config, batch: int, weight_bytes: float) -> str:
    """Name the slip: the per-position bytes it used, and what it did with the batch."""
    for position_bytes, hint in POSITION_BYTES:
        per_position = position_bytes(config)
        for answer, batch_hint in ((weight_bytes / (batch * per_position), None),
                                   (weight_bytes / per_position,
                                    "every row reads its own cache: divide by batch x bytes per cached position."),
                                   (weight_bytes * batch / per_position,
                                    "more rows bring the crossover closer: divide by the batch, not multiply.")):
            if close_enough(got, answer, rel=1e-6) and (hint or batch_hint):
                return " ".join(h for h in (hint, batch_hint) if h)
    return ("n* = weight_bytes / (batch x layers x 2 x kv-heads x (head_dim + 2)): one int8 byte per value and a "
            "2-byte scale per token per kv-head, for keys and for values.")


CROSSOVER_EXERCISE = Exercise(
    title=CROSSOVER,
    teaches="the context at which a decode step reads as many bytes of int8 cache (values and scales) as of weights",
    computed_by=("labsupport.engine.kv_quant.int8_kv_cache_bytes", "labsupport.engine.kv_quant.Int8KVCache",
                 "labsupport.engine.kv_quant.Int8KVCache.nbytes", "labsupport.engine.kv_cache.kv_cache_bytes",
                 "labsupport.engine.kv_cache.StaticKVCache", "labsupport.engine.kv_cache.StaticKVCache.nbytes"),
    receives=("labsupport.engine.config.ModelConfig",),
    allowed=("labsupport.engine.config.ModelConfig.head_dim",))


@grades_quietly
@graded(CROSSOVER_EXERCISE)
def check_int8_crossover(fn) -> None:
    """Check `fn(weight_bytes, config, batch)` -> the crossover context of the int8 cache.

    Introduced in notebook 08 (long context), exercise 2: n* = W / (B x c) with c, the bytes of one
    cached position, worked out for `Int8KVCache` (int8 values and a bfloat16 scale per token per
    kv-head, for keys and values: `int8_kv_cache_bytes(config, 1)`), which the notebook does not
    spell out. Each slip of the position's bytes or of the batch gives its own answer and hint. The
    package's cache byte counts and the config's own counts (kv_values_per_token, ...) are refused
    (`CROSSOVER_EXERCISE`)."""
    for name, batch, weight_bytes in CROSSOVER_CASES:
        config = PRESETS[name]
        expected = weight_bytes / (batch * int8_kv_cache_bytes(config, 1, 1))
        case = f"{name}, batch {batch}, {weight_bytes:.3g} weight bytes"
        got = call_learner(CROSSOVER, f"{expected:,.1f} tokens ({case})",
                           "use config.num_layers, config.num_kv_heads and config.head_dim.",
                           fn, weight_bytes, config, batch)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            fail(CROSSOVER, f"a number of tokens ({case})", type(got).__name__, "return a number (a float is fine).")
        if not close_enough(float(got), expected, rel=1e-6):
            fail(CROSSOVER, f"{expected:,.1f} tokens ({case})", f"{float(got):,.1f}",
                 _crossover_hint(float(got), config, batch, weight_bytes))
    passed(CROSSOVER, "Past that context even the int8 cache outweighs the weights: its scales cost "
                      "2 / head_dim more than half a 16-bit cache.")
