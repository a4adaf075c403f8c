"""Checkers for notebook 00 (where the time goes).

Introduced in notebook 00 (where the time goes). Each compares a learner's
answer with `labsupport.roofline` and either confirms it or raises
`CheckFailed` with what was expected, what came back, and a hint.
"""

from __future__ import annotations

import torch

from ..hardware import dtype_name
from ..measure import HardwareProfile
from ..models.config import PRESETS, ModelConfig
from ..roofline import attention_flops, decode_step_cost, matmul_params, ridge_batch
from . import close_enough, fail, passed

# (config, batch, context, bytes per value): chosen so that forgetting lm_head,
# the attention FLOPs, the KV cache or the batch shows in the answer.
DECODE_CASES = (
    (PRESETS["smollm2-135m"], 1, 0, 4),
    (PRESETS["smollm2-135m"], 8, 1024, 2),
    (PRESETS["gpt2"], 4, 512, 4),
)
TOLERANCE = 0.01   # 1%: counting or skipping the norms and biases is fine


def _hint_for_flops(config: ModelConfig, batch: int, context: int, got: float) -> str:
    """Guess which term a wrong FLOP count is missing."""
    expected = decode_step_cost(config, batch, context, 4).flops
    lm_head = 2 * config.vocab_size * config.hidden_size * batch
    if close_enough(got, expected - lm_head, 0.02):
        return "you left out the output projection (lm_head, vocab x hidden), which every row multiplies too."
    if context and close_enough(got, expected - attention_flops(config, batch, context), 0.02):
        return ("you left out attention over the cache: per layer and query head, 2 x head_dim FLOPs per "
                "cached token for the scores and 2 x head_dim for the weighted values.")
    if close_enough(got * batch, expected, 0.02):
        return "every row of the batch does its own multiplications: multiply by batch."
    return ("2 FLOPs (multiply + add) per matmul weight per row, lm_head included, plus "
            "4 x layers x heads x head_dim x context x batch for attention.")


def _hint_for_bytes(config: ModelConfig, batch: int, context: int, size: int, got: float) -> str:
    cost = decode_step_cost(config, batch, context, size)
    if close_enough(got, cost.weight_bytes, 0.02) and cost.kv_bytes:
        return ("you counted the weights but not the KV cache: each row reads layers x 2 (K and V) x "
                "kv_heads x head_dim x context values.")
    if close_enough(got, cost.weight_bytes * batch + cost.kv_bytes, 0.02):
        return "the weights are read once per step and shared by all rows: do not multiply them by batch."
    if close_enough(got * size, cost.bytes, 0.02):
        return "multiply the number of values by bytes_per_value."
    return ("bytes = (every weight read once: config.num_parameters, the embedding counted once as lm_head "
            "when tied) x bytes_per_value + the KV cache of all rows.")


def check_decode_step_cost(fn) -> None:
    """Check a learner's `fn(config, batch, context, bytes_per_value) -> (flops, bytes)`.

    Introduced in notebook 00 (where the time goes). Compared with
    `roofline.decode_step_cost` on SmolLM2-135M and GPT-2 shapes, within 1%.
    """
    exercise = "FLOPs and bytes of one decode step"
    for config, batch, context, size in DECODE_CASES:
        case = f"{config.name}, batch {batch}, context {context}, {size} bytes per value"
        answer = fn(config, batch, context, size)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            fail(exercise, "a pair (flops, bytes)", repr(answer)[:80], "end the function with: return flops, nbytes")
        flops, nbytes = (float(a) for a in answer)
        cost = decode_step_cost(config, batch, context, size)
        if not close_enough(flops, cost.flops, TOLERANCE):
            fail(f"{exercise} ({case}), FLOPs", f"{cost.flops:.4g}", f"{flops:.4g}",
                 _hint_for_flops(config, batch, context, flops))
        if not close_enough(nbytes, cost.bytes, TOLERANCE):
            fail(f"{exercise} ({case}), bytes", f"{cost.bytes:.4g}", f"{nbytes:.4g}",
                 _hint_for_bytes(config, batch, context, size, nbytes))
    passed(exercise, f"Checked on {len(DECODE_CASES)} configurations.")


def check_ridge_batch(answer: float, profile: HardwareProfile, config: ModelConfig,
                      dtype=torch.float32, context: int = 0) -> None:
    """Check a learner's predicted ridge batch size against `roofline.ridge_batch` (within 5%).

    Introduced in notebook 00 (where the time goes).
    """
    exercise = "ridge batch size"
    expected = ridge_batch(profile, config, dtype, context)
    name = dtype_name(dtype)
    try:
        got = float(answer)
    except (TypeError, ValueError):
        fail(exercise, "a number", repr(answer)[:80], "assign a float, e.g. predicted_ridge_batch = 12.3")
    if not close_enough(got, expected, 0.05):
        ridge = profile.ridge(dtype)
        if close_enough(got, ridge, 0.05):
            hint = ("that is the ridge point in FLOP/byte; the batch is where the step's intensity, "
                    "about 2 x params x batch / weight bytes, reaches it.")
        elif close_enough(got, ridge * 2 * matmul_params(config) / decode_step_cost(config, 1, 0, dtype).weight_bytes, 0.1):
            hint = "you multiplied where you should divide: batch = ridge x weight bytes / (2 x params)."
        else:
            hint = (f"ridge = FLOP/s / bandwidth = {ridge:.2f} FLOP/byte for {name}; solve "
                    "2 x params x batch / weight_bytes = ridge for batch.")
        fail(exercise, f"about {expected:.1f}", f"{got:.3g}", hint)
    passed(exercise, f"{got:.1f} rows; the reference says {expected:.1f} for {name} on {profile.name}.")
