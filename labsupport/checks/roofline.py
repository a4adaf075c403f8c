"""Checkers for notebook 00 (where the time goes).

Introduced in notebook 00 (where the time goes). Each compares a learner's
answer with `labsupport.lab.roofline` and either confirms it or raises
`CheckFailed` with what was expected, what came back, and a hint.

Each checker knows the typical wrong answers of its exercise (the `*_MISTAKES`
tables: a hint and how that mistake computes), and calls the learner's code on
inputs where every one of them gives a different answer from the right one:
a batch above 1 and a cache (context) so that per-row and cache terms show,
grouped-query attention (SmolLM2: 9 query, 3 key-value heads), 2 and 4 bytes per
value, GPT-2's learned position table, an untied output layer, and heads wider than
hidden_size / num_heads (Qwen3-0.6B's shapes).

Each checker grades by reach (`grading.graded`): its `Exercise` declares the quantity it
teaches, and the package code that computes it (the config's own cost methods among them)
is refused.
"""

from __future__ import annotations

import math

import torch

from ..engine.hardware import dtype_name
from ..lab.roofs import HardwareProfile
from ..engine.config import PRESETS, ModelConfig
from ..lab.roofline import (COMPUTE_BOUND, MEMORY_BOUND, OVERHEAD_BOUND, attention_flops, bytes_per_value,
                            decode_step_cost, matmul_params, ridge_batch, step_bounds)
from . import close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded

SMOLLM2 = PRESETS["smollm2-135m"]
# Heads wider than hidden_size / num_heads, as some checkpoints have them (Qwen3-0.6B's shapes):
# only such a config tells config.head_dim apart from hidden_size // num_heads (notebooks 00 and 01).
WIDE_HEADS = ModelConfig(family="llama", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                         num_kv_heads=8, intermediate_size=3072, max_position=40960, explicit_head_dim=128,
                         name="qwen3-0.6b-shape")
# (config, batch, context, bytes per value): chosen so that each mistake below shows.
DECODE_CASES = (
    (SMOLLM2, 1, 0, 4),
    (SMOLLM2, 8, 1024, 2),
    (PRESETS["gpt2"], 4, 512, 4),
    (SMOLLM2.with_(tie_embeddings=False, name="smollm2-135m with an untied lm_head"), 2, 256, 2),
    (WIDE_HEADS, 3, 300, 2),
)
TOLERANCE = 0.003  # 0.3%: counting or skipping norms and biases is fine, GPT-2's position table is not


def _attention_with_kv_heads(c: ModelConfig, b: int, n: int) -> float:
    return 4 * c.num_layers * c.num_kv_heads * c.head_dim * n * b


def _narrow_heads(c: ModelConfig) -> ModelConfig:
    """`c` with heads of hidden_size / num_heads, the slip of a count that ignores config.head_dim."""
    return c.with_(explicit_head_dim=None) if c.explicit_head_dim else c


HEAD_DIM_HINT = ("use config.head_dim: some models' heads are wider than hidden_size / num_heads "
                 "(qwen3-0.6b-shape: 128, not 64).")


# Wrong FLOP counts: (hint, flops(config, batch, context, bytes per value)).
FLOP_MISTAKES = (
    ("you left out the output projection (lm_head, vocab x hidden), which every row multiplies too.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).flops - 2 * c.vocab_size * c.hidden_size * b),
    ("you left out attention over the cache: per layer and query head, 2 x head_dim FLOPs per "
     "cached token for the scores and 2 x head_dim for the weighted values.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).flops - attention_flops(c, b, n)),
    ("attention runs for every query head (num_heads); only the cache is shared by groups of heads "
     "(num_kv_heads).",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).flops - attention_flops(c, b, n)
     + _attention_with_kv_heads(c, b, n)),
    ("every row of the batch does its own multiplications: multiply the FLOPs by batch.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).flops / b),
    ("a multiply-add is 2 FLOPs (a multiply and an add): 2 per matmul weight per row, not 1.",
     lambda c, b, n, s: matmul_params(c) * b + attention_flops(c, b, n)),
    ("a multiply-add is 2 FLOPs (a multiply and an add): 2 per matmul weight per row, not 1.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).flops / 2),
    (HEAD_DIM_HINT, lambda c, b, n, s: decode_step_cost(_narrow_heads(c), b, n, s).flops),
)

# Wrong byte counts: (hint, bytes(config, batch, context, bytes per value)).
BYTE_MISTAKES = (
    ("you counted the weights but not the KV cache: each row reads layers x 2 (K and V) x "
     "kv_heads x head_dim x context values.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).weight_bytes),
    ("the weights are read once per step and shared by all rows: do not multiply them by batch.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).weight_bytes * b + decode_step_cost(c, b, n, s).kv_bytes),
    ("the KV cache holds num_kv_heads heads per layer, not num_heads (grouped-query attention).",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).weight_bytes
     + decode_step_cost(c, b, n, s).kv_bytes * c.num_heads / c.num_kv_heads),
    ("the cache holds two tensors per layer, K and V: layers x 2 x kv_heads x head_dim x context values per row.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).weight_bytes + decode_step_cost(c, b, n, s).kv_bytes / 2),
    ("each row has its own KV cache: multiply the cache by batch.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).weight_bytes + decode_step_cost(c, b, n, s).kv_bytes / b),
    ("you counted values, not bytes: multiply the number of values by bytes_per_value.",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).bytes / s),
    ("use the bytes_per_value argument, not a fixed 4 bytes (float32).",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).bytes * 4 / s),
    ("the token embedding is a lookup (one row per token): it is read in full only as lm_head when "
     "tied, and then once (a tied lm_head is the embedding: one matrix).",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).bytes + c.vocab_size * c.hidden_size * s),
    ("a GPT-2 model's learned position table is looked up, one row per token: leave it out "
     "(max_position x hidden).",
     lambda c, b, n, s: decode_step_cost(c, b, n, s).bytes + c.max_position * c.hidden_size * s),
    (HEAD_DIM_HINT, lambda c, b, n, s: decode_step_cost(_narrow_heads(c), b, n, s).bytes),
)


def _hint(mistakes, got: float, args: tuple, expected: float, fallback: str) -> str:
    """The hint of the first mistake that gives `got` on `args` (and differs from `expected`), else `fallback`."""
    for hint, wrong in mistakes:
        value = wrong(*args)
        if not close_enough(value, expected, TOLERANCE) and close_enough(got, value, TOLERANCE):
            return hint
    return fallback


STEP_COST = Exercise(
    title="FLOPs and bytes of one decode step",
    teaches="the FLOPs and bytes of one decode step, counted from the config's shapes",
    # the config's own cost model computes every part of it; a model or a cache counts its bytes too
    computed_by=("labsupport.engine.config.ModelConfig.decode_flops",
                 "labsupport.engine.config.ModelConfig.attention_flops",
                 "labsupport.engine.config.ModelConfig.matmul_params",
                 "labsupport.engine.config.ModelConfig.params_read_per_step",
                 "labsupport.engine.config.ModelConfig.num_parameters",
                 "labsupport.engine.config.ModelConfig.kv_values_per_token",
                 "labsupport.engine.kv_cache.kv_cache_bytes",
                 "labsupport.engine.models.transformer.Transformer.weight_bytes",
                 "labsupport.engine.precision.tensor_bytes"),
    receives=("labsupport.engine.config.ModelConfig",),
    allowed=("labsupport.engine.config.ModelConfig.head_dim",))   # a field of the shape: the heads' width


@grades_quietly
@graded(STEP_COST)
def check_decode_step_cost(fn) -> None:
    """Check a learner's `fn(config, batch, context, bytes_per_value) -> (flops, bytes)`.

    Introduced in notebook 00 (where the time goes). Compared with
    `roofline.decode_step_cost` within 0.3% on SmolLM2-135M (tied and untied), GPT-2 and
    Qwen3-0.6B shapes (heads wider than hidden_size / num_heads); a wrong count gets the
    hint of the mistake that gives it (`FLOP_MISTAKES`, `BYTE_MISTAKES`). Graded by reach
    (`STEP_COST`): the config's cost methods and properties are refused, its head_dim is not.
    """
    exercise = STEP_COST.title
    for config, batch, context, size in DECODE_CASES:
        case = f"{config.name}, batch {batch}, context {context}, {size} bytes per value"
        answer = fn(config, batch, context, size)
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            fail(exercise, "a pair (flops, bytes)", repr(answer)[:80], "end the function with: return flops, nbytes")
        flops, nbytes = (float(a) for a in answer)
        cost = decode_step_cost(config, batch, context, size)
        args = (config, batch, context, size)
        if not close_enough(flops, cost.flops, TOLERANCE):
            fail(f"{exercise} ({case}), FLOPs", f"{cost.flops:.4g}", f"{flops:.4g}",
                 _hint(FLOP_MISTAKES, flops, args, cost.flops,
                       "2 FLOPs (multiply + add) per matmul weight per row, lm_head included, plus "
                       "4 x layers x heads x head_dim x context x batch for attention."))
        if not close_enough(nbytes, cost.bytes, TOLERANCE):
            fail(f"{exercise} ({case}), bytes", f"{cost.bytes:.4g}", f"{nbytes:.4g}",
                 _hint(BYTE_MISTAKES, nbytes, args, cost.bytes,
                       "bytes = (every matmul weight read once, lm_head included; the lookup tables are not "
                       "read in full) x bytes_per_value + the KV cache of all rows."))
    passed(exercise, f"Checked on {len(DECODE_CASES)} configurations.")


def _ridge_mistakes(profile: HardwareProfile, config: ModelConfig, dtype) -> list[tuple[str, float]]:
    """(hint, the answer that mistake gives) for the ridge-batch exercise at context 0."""
    ridge, size = profile.ridge(dtype), bytes_per_value(dtype)
    weight_bytes = decode_step_cost(config, 1, 0, dtype).weight_bytes
    flops_per_row = 2 * matmul_params(config)
    right = ridge * weight_bytes / flops_per_row
    mistakes = [
        ("that is the ridge point in FLOP/byte; the batch is where the step's intensity, "
         "about 2 x params x batch / weight bytes, reaches it.", ridge),
        # In float32 these two give nearly the same number (weight bytes ~ 4 x params): one hint for both.
        ("you multiplied where you should divide, or counted the weights in parameters: batch = ridge x "
         "weight bytes / (2 x params), with weight bytes = parameters x bytes per value.",
         ridge * flops_per_row / weight_bytes),
        ("count the weights in bytes, not in parameters: batch = ridge x weight bytes / (2 x params), "
         "with weight bytes = parameters x bytes per value.", right / size),
        ("a row does 2 FLOPs per weight (multiply + add): its FLOPs are 2 x params, so divide by that.",
         2 * right),
        ("the ridge is peak FLOP/s divided by the bandwidth (FLOP per byte), not the FLOP/s alone.",
         right * profile.bandwidth),
        ("the ridge is peak / bandwidth, not bandwidth / peak.", right / ridge ** 2),
        ("weight_bytes already counts the bytes per value; do not multiply by it again.", right * size),
    ]
    for other in profile.flops:
        if other != dtype_name(dtype):
            mistakes.append((f"use the {dtype_name(dtype)} peak (profile.flops[{dtype_name(dtype)!r}]), "
                             f"not the {other} one.", right * profile.ridge(other) / ridge))
    return mistakes


def _cache_mistakes(profile: HardwareProfile, config: ModelConfig, dtype, context: int) -> list[tuple[str, float]]:
    """(hint, the answer that mistake gives) for the ridge-batch exercise with a KV cache (context > 0)."""
    ridge = profile.ridge(dtype)
    one_row = decode_step_cost(config, 1, context, dtype)
    attention = one_row.flops - 2 * matmul_params(config)
    return [
        ("that is (about) the empty-cache answer: with a context each row also reads its own keys and values; "
         "the KV cache is not shared like the weights, so its bytes grow with the batch as its FLOPs do.",
         ridge_batch(profile, config, dtype, 0)),
        ("the KV cache is not shared: every row reads its own, so its bytes grow with the batch "
         "(batch x kv_bytes of one row), unlike the weights.",
         ridge * (one_row.weight_bytes + one_row.kv_bytes) / one_row.flops),
        ("a row's FLOPs include attention over its cached tokens, not only 2 per weight.",
         ridge * one_row.weight_bytes / (one_row.flops - attention - ridge * one_row.kv_bytes)),
        ("that is the ridge point in FLOP/byte, not a batch size.", ridge),
    ]


RIDGE_BATCH = Exercise(
    title="ridge batch size",
    teaches="the batch size at which a decode step's intensity reaches the ridge point")   # a value: nothing runs


@grades_quietly
@graded(RIDGE_BATCH)
def check_ridge_batch(answer: float, profile: HardwareProfile, config: ModelConfig,
                      dtype=torch.float32, context: int = 0) -> None:
    """Check a learner's predicted ridge batch size against `roofline.ridge_batch` (within 5%).

    Introduced in notebook 00 (where the time goes). A wrong number gets the hint of the
    mistake that gives it: at context 0, the ridge point itself, multiplying instead of
    dividing, FLOPs without the factor 2, the ridge taken from FLOP/s alone or upside down,
    bytes per value left out or counted twice, another dtype's peak; with a cache (the
    notebook asks at its CONTEXT), the empty-cache answer, one row's cache counted as if
    shared, attention's FLOPs left out. A context past `roofline.ridge_context` expects inf.
    """
    exercise = RIDGE_BATCH.title
    expected = ridge_batch(profile, config, dtype, context)
    name = dtype_name(dtype)
    try:
        got = float(answer)
    except (TypeError, ValueError):
        fail(exercise, "a number", repr(answer)[:80], "assign a float, e.g. predicted_ridge_batch = 12.3")
    if math.isinf(expected):
        if math.isinf(got) and got > 0:
            passed(exercise, f"no batch reaches the {name} ridge at context {context} on {profile.name}: right.")
            return
        fail(exercise, "about inf (no batch)", f"{got:.3g}",
             f"at context {context} each row's cache adds more bytes than the {name} ridge allows for its FLOPs, "
             "so no batch gets there: roofline.ridge_context says where that starts.")
    if not close_enough(got, expected, 0.05):
        hint = (f"ridge = FLOP/s / bandwidth = {profile.ridge(dtype):.2f} FLOP/byte for {name}; solve "
                "intensity(batch) = ridge for batch, with every byte the step reads.")
        mistakes = _ridge_mistakes(profile, config, dtype) if context == 0 else _cache_mistakes(profile, config, dtype, context)
        hint = next((h for h, value in mistakes
                     if close_enough(got, value, 0.05) and not close_enough(value, expected, 0.05)), hint)
        fail(exercise, f"about {expected:.1f}", f"{got:.3g}", hint)
    passed(exercise, f"{got:.1f} rows; the reference says {expected:.1f} for {name} on {profile.name}.")


# --- Exercise 3: what held back each measured step ------------------------------------------

STEP_PROFILE = HardwareProfile(device="cpu", name="a made-up machine", bandwidth=10e9,
                               flops={"float32": 100e9, "bfloat16": 400e9})   # ridges 10 and 40 FLOP/B


def _synthetic_row(dtype: str, batch: int, flops: float, nbytes: float, seconds: float) -> dict:
    return {"batch": batch, "dtype": dtype, "seconds": seconds, "flops": flops, "bytes": nbytes,
            "intensity": flops / nbytes, "tokens_per_s": batch / seconds,
            "flops_per_s": flops / seconds, "bytes_per_s": nbytes / seconds}


# Each row tells one mistake apart (memory / compute times on STEP_PROFILE in the comments).
STEP_ROWS = [
    _synthetic_row("float32", 1, 1e9, 1e9, 0.15),     # 0.10 s / 0.01 s: memory-bound, near the roof
    _synthetic_row("float32", 2, 1e9, 1e9, 0.50),     # 5x the roofline time: overhead-bound
    _synthetic_row("float32", 64, 2e9, 1e8, 0.03),    # 0.01 s / 0.02 s: compute-bound
    _synthetic_row("float32", 8, 8e9, 1e9, 0.30),     # 0.10 s / 0.08 s: 3x the roofline, just overhead-bound
    _synthetic_row("bfloat16", 16, 8e9, 4e8, 0.05),   # 0.04 s / 0.02 s (bf16 peak): memory-bound
    _synthetic_row("float32", 6, 8e9, 1e9, 0.12),     # 0.10 s / 0.08 s: a little slower than the roof, memory-bound
    # on the boundaries (exact in floating point): the labels say which side each belongs to
    _synthetic_row("float32", 3, 2e8, 2e9, 0.4),      # 0.2 s / 0.002 s, exactly 2x the roof: not overhead at slack 2
    _synthetic_row("float32", 12, 1e10, 1e9, 0.12),   # intensity exactly 10, the ridge: compute-bound
]


def _bounds_with(roof, ridge_of=None, at_the_boundary=None):
    """A wrong `step_bounds` that predicts the time with `roof(memory_s, compute_s)` (None: no overhead test);
    at_the_boundary="overhead" / "ridge": a row exactly on that boundary put on the wrong side."""
    def wrong(rows, profile, slack):
        labels = []
        for row in rows:
            name = ridge_of or row["dtype"]
            memory_s, compute_s = row["bytes"] / profile.bandwidth, row["flops"] / profile.flops[name]
            over = roof is not None and row["seconds"] > slack * roof(memory_s, compute_s)
            if over or (at_the_boundary == "overhead" and row["seconds"] == slack * roof(memory_s, compute_s)):
                labels.append(OVERHEAD_BOUND)
            elif row["intensity"] < profile.ridge(name) or (
                    at_the_boundary == "ridge" and row["intensity"] == profile.ridge(name)):
                labels.append(MEMORY_BOUND)
            else:
                labels.append(COMPUTE_BOUND)
        return labels
    return wrong


# Wrong classifications: (hint, bounds(rows, profile, slack)).
STEP_MISTAKES = (
    ("the roofline time is the slower of the two limits, max(bytes / bandwidth, FLOPs / peak), not the faster.",
     _bounds_with(min)),
    ("the roofline takes reading and computing to overlap: its time is the larger of the two, not their sum.",
     _bounds_with(lambda m, c: m + c)),
    ("a step past the ridge is limited by FLOPs / peak, not by bytes / bandwidth: take the max of both.",
     _bounds_with(lambda m, c: m)),
    ("first test whether the step took more than slack x its roofline time (then it is overhead-bound).",
     _bounds_with(None)),
    ("a step counts as overhead-bound only beyond slack x its roofline time, not as soon as it is slower.",
     lambda rows, profile, slack: _bounds_with(max)(rows, profile, 1.0)),
    ("use the slack argument, not a fixed 2.",
     lambda rows, profile, slack: _bounds_with(max)(rows, profile, 2.0)),
    ("use each row's own dtype: its peak is profile.flops[row['dtype']] and its ridge profile.ridge(row['dtype']).",
     _bounds_with(max, ridge_of="float32")),
    ("a step that took exactly slack x its roofline time is not overhead-bound: only more than that is "
     "(seconds > slack x roofline time).", _bounds_with(max, at_the_boundary="overhead")),
    ("a step exactly at the ridge is compute-bound: memory-bound is only below it (intensity < ridge).",
     _bounds_with(max, at_the_boundary="ridge")),
)


def _compare_bounds(fn, rows: list[dict], profile: HardwareProfile, slack: float, where: str) -> None:
    """Fail with the matching hint unless fn(rows, profile, slack) is `step_bounds`' answer."""
    exercise = STEP_BOUNDS.title
    expected = step_bounds(rows, profile, slack)
    got = fn([dict(row) for row in rows], profile, slack)          # copies: the learner may change them
    if not (isinstance(got, (list, tuple)) and len(got) == len(rows)):
        fail(f"{exercise} ({where})", f"a list of {len(rows)} labels, one per row", repr(got)[:80],
             "append one label per row and return the list.")
    got = list(got)
    if got == expected:
        return
    strange = sorted({str(g) for g in got} - {MEMORY_BOUND, COMPUTE_BOUND, OVERHEAD_BOUND})
    if strange:
        hint = f"use exactly the labels {MEMORY_BOUND!r}, {COMPUTE_BOUND!r} and {OVERHEAD_BOUND!r}, not {strange}."
    else:
        hint = next((h for h, wrong in STEP_MISTAKES if wrong(rows, profile, slack) == got),
                    "predict each row's time as max(bytes / bandwidth, FLOPs / peak of its dtype); more than "
                    "slack x that is overhead-bound, else compare its intensity with the ridge of its dtype.")
    first = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
    row = rows[first]
    fail(f"{exercise} ({where}, slack {slack})", f"{expected[first]!r} for {row['dtype']} batch {row['batch']}",
         repr(got[first]), hint)


STEP_BOUNDS = Exercise(
    title="what held back each step",
    teaches="each measured step's label: its roofline time, max(bytes / bandwidth, FLOPs / peak), against "
            "its measured time, then its intensity against the ridge",
    receives=("labsupport.lab.roofs.HardwareProfile",),             # its attainable() is the roofline itself
    allowed=("labsupport.lab.roofs.HardwareProfile.ridge",))        # peak / bandwidth: exercise 2's, named in the text


@grades_quietly
@graded(STEP_BOUNDS)
def check_step_bounds(fn, rows: list[dict] | None = None, profile: HardwareProfile | None = None) -> None:
    """Check a learner's `fn(rows, profile, slack) -> list of "memory-bound" / "compute-bound" / "overhead-bound"`.

    Introduced in notebook 00 (where the time goes). Compared with `roofline.step_bounds`
    on made-up rows where each typical mistake (`STEP_MISTAKES`) gives another answer, rows
    exactly on the overhead and ridge boundaries among them, at slack 2 and 3, then on this
    notebook's own sweep when `rows` and `profile` are given. Graded by reach (`STEP_BOUNDS`).
    """
    for slack in (2.0, 3.0):
        _compare_bounds(fn, STEP_ROWS, STEP_PROFILE, slack, "made-up rows")
    if rows is not None and profile is not None:
        _compare_bounds(fn, rows, profile, 2.0, "this notebook's sweep")
    counted = "" if rows is None else f" and on the {len(rows)} steps measured here"
    passed(STEP_BOUNDS.title, f"Checked on {len(STEP_ROWS)} made-up rows{counted}.")

