"""Checker cases of notebook 00 (where the time goes): the reference and each typical mistake."""

from typing import NamedTuple

import torch

from labsupport.lab import roofline
from labsupport.checks.roofline import check_decode_step_cost, check_ridge_batch, check_step_bounds
from labsupport.lab.measure import Timing
from labsupport.lab.roofs import HardwareProfile
from labsupport.engine.config import PRESETS

from checker_cases.common import accepts, refuses


# --- notebook 00 (where the time goes) ----------------------------------------------------

TINY = PRESETS["tiny-llama"]
FAKE_PROFILE = HardwareProfile(device="cpu", name="fake CPU", bandwidth=10e9, flops={"float32": 100e9})
TWO_DTYPES = HardwareProfile(device="cpu", name="fake CPU with bf16", bandwidth=10e9,
                             flops={"float32": 100e9, "bfloat16": 300e9})


# Exercise 1, the count of one decode step: the reference and one function per typical mistake.

def decode_cost(config, batch, context, bytes_per_value):
    cost = roofline.decode_step_cost(config, batch, context, bytes_per_value)
    return cost.flops, cost.bytes


def by_hand(config, batch, context, size):
    """The notebook's solution, written out without the package: counted, not copied."""
    h, i = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_layer = h * (q_size + 2 * kv_size) + q_size * h + (3 if config.family == "llama" else 2) * h * i
    flops = 2 * (config.num_layers * per_layer + config.vocab_size * h) * batch \
        + 4 * config.num_layers * config.num_heads * config.head_dim * context * batch
    params = config.num_parameters
    if not config.tie_embeddings:
        params -= config.vocab_size * h
    if config.family == "gpt2":
        params -= config.max_position * h
    return flops, (params + config.num_layers * 2 * kv_size * context * batch) * size


class HandCost(NamedTuple):
    """What roofline.decode_step_cost returns, counted by hand (the checker refuses a call of it)."""
    flops: float
    bytes: float
    weight_bytes: float
    kv_bytes: float


def hand_cost(config, batch, context, size):
    flops, nbytes = by_hand(config, batch, context, size)
    kv_bytes = config.num_layers * 2 * config.num_kv_heads * config.head_dim * context * batch * size
    return HandCost(flops, nbytes, nbytes - kv_bytes, kv_bytes)


def _with(flops=None, nbytes=None):
    """A learner's function that gets one of the two counts wrong by `flops(...)` or `nbytes(...)`."""
    def learner(config, batch, context, size):
        cost = hand_cost(config, batch, context, size)
        args = (config, batch, context, size, cost)
        return (flops(*args) if flops else cost.flops), (nbytes(*args) if nbytes else cost.bytes)
    return learner


def attention(config, batch, context, heads):
    return 4 * config.num_layers * heads * config.head_dim * context * batch


no_lm_head = _with(flops=lambda c, b, n, s, cost: cost.flops - 2 * c.vocab_size * c.hidden_size * b)
no_attention = _with(flops=lambda c, b, n, s, cost: cost.flops - attention(c, b, n, c.num_heads))
attention_over_kv_heads = _with(flops=lambda c, b, n, s, cost: cost.flops - attention(c, b, n, c.num_heads)
                                + attention(c, b, n, c.num_kv_heads))
flops_of_one_row = _with(flops=lambda c, b, n, s, cost: cost.flops / b)
one_flop_per_weight = _with(flops=lambda c, b, n, s, cost: roofline.matmul_params(c) * b
                            + attention(c, b, n, c.num_heads))
no_cache = _with(nbytes=lambda c, b, n, s, cost: cost.weight_bytes)
weights_read_per_row = _with(nbytes=lambda c, b, n, s, cost: cost.weight_bytes * b + cost.kv_bytes)
cache_of_query_heads = _with(nbytes=lambda c, b, n, s, cost: cost.weight_bytes
                             + cost.kv_bytes * c.num_heads / c.num_kv_heads)
cache_without_values = _with(nbytes=lambda c, b, n, s, cost: cost.weight_bytes + cost.kv_bytes / 2)
cache_of_one_row = _with(nbytes=lambda c, b, n, s, cost: cost.weight_bytes + cost.kv_bytes / b)
values_not_bytes = _with(nbytes=lambda c, b, n, s, cost: cost.bytes / s)
always_four_bytes = _with(nbytes=lambda c, b, n, s, cost: cost.bytes / s * 4)
tied_embedding_twice = _with(nbytes=lambda c, b, n, s, cost: cost.bytes
                             + (c.vocab_size * c.hidden_size * s if c.tie_embeddings else 0))
untied_embedding_read = _with(nbytes=lambda c, b, n, s, cost: cost.bytes
                              + (0 if c.tie_embeddings else c.vocab_size * c.hidden_size * s))
position_table_read = _with(nbytes=lambda c, b, n, s, cost: cost.bytes
                            + (c.max_position * c.hidden_size * s if c.family == "gpt2" else 0))


# Exercise 2, the ridge batch: the right number and the number each mistake gives.

RIDGE = FAKE_PROFILE.ridge("float32")
WEIGHT_BYTES = roofline.decode_step_cost(TINY, 1, 0).weight_bytes
FLOPS_PER_ROW = 2 * roofline.matmul_params(TINY)
RIGHT = roofline.ridge_batch(FAKE_PROFILE, TINY, torch.float32)
CONTEXT = 16
AT_CONTEXT = roofline.decode_step_cost(TINY, 1, CONTEXT)
RIGHT_AT_CONTEXT = roofline.ridge_batch(FAKE_PROFILE, TINY, torch.float32, CONTEXT)
PAST_RIDGE_CONTEXT = int(roofline.ridge_context(FAKE_PROFILE, TINY, torch.float32)) + 1


# Exercise 3, what held back each step: the reference and one function per mistake.

def bounds_by_hand(rows, profile, slack=2.0):
    labels = []
    for row in rows:
        memory_s = row["bytes"] / profile.bandwidth
        compute_s = row["flops"] / profile.flops[row["dtype"]]
        if row["seconds"] > slack * max(memory_s, compute_s):
            labels.append("overhead-bound")
        elif row["intensity"] < profile.ridge(row["dtype"]):
            labels.append("memory-bound")
        else:
            labels.append("compute-bound")
    return labels


def _bounds(roof=max, slack_used=None, dtype=None, overhead_test=True):
    def learner(rows, profile, slack=2.0):
        labels = []
        for row in rows:
            name = dtype or row["dtype"]
            memory_s, compute_s = row["bytes"] / profile.bandwidth, row["flops"] / profile.flops[name]
            if overhead_test and row["seconds"] > (slack_used or slack) * roof(memory_s, compute_s):
                labels.append("overhead-bound")
            elif row["intensity"] < profile.ridge(name):
                labels.append("memory-bound")
            else:
                labels.append("compute-bound")
        return labels
    return learner


def inverted_overhead_test(rows, profile, slack=2.0):
    return ["overhead-bound" if slack * row["seconds"] < roofline.roofline_seconds(row, profile) else
            "memory-bound" if row["intensity"] < profile.ridge(row["dtype"]) else "compute-bound" for row in rows]


def short_labels(rows, profile, slack=2.0):
    return [label.split("-")[0] for label in bounds_by_hand(rows, profile, slack)]


def tiny_sweep():
    """Rows as sweep_decode returns them, on TWO_DTYPES, for the check on a notebook's own sweep."""
    rows = []
    for name, size in (("float32", 4), ("bfloat16", 2)):
        for batch, seconds in ((1, 3e-5), (8, 4e-5), (64, 2e-4)):
            cost = roofline.decode_step_cost(TINY, batch, 16, size)
            rows.append(roofline._row(batch, Timing([seconds] * 3), cost, name))
    return rows


NOTEBOOK_00 = [
    refuses(check_decode_step_cost, "the-packages-own-answer", "write the steps yourself", decode_cost),
    accepts(check_decode_step_cost, "counted-by-hand", by_hand),
    refuses(check_decode_step_cost, "missing-lm-head", "lm_head", no_lm_head),
    refuses(check_decode_step_cost, "missing-attention", "attention over the cache", no_attention),
    refuses(check_decode_step_cost, "attention-over-kv-heads", "every query head", attention_over_kv_heads),
    refuses(check_decode_step_cost, "flops-of-one-row", "multiply the FLOPs by batch", flops_of_one_row),
    refuses(check_decode_step_cost, "one-flop-per-weight", "2 FLOPs", one_flop_per_weight),
    refuses(check_decode_step_cost, "missing-kv-bytes", "not the KV cache", no_cache),
    refuses(check_decode_step_cost, "weights-read-per-row", "shared by all rows", weights_read_per_row),
    refuses(check_decode_step_cost, "cache-of-query-heads", "num_kv_heads heads", cache_of_query_heads),
    refuses(check_decode_step_cost, "cache-without-values", "K and V", cache_without_values),
    refuses(check_decode_step_cost, "cache-of-one-row", "each row has its own KV cache", cache_of_one_row),
    refuses(check_decode_step_cost, "values-not-bytes", "counted values, not bytes", values_not_bytes),
    refuses(check_decode_step_cost, "always-four-bytes", "not a fixed 4 bytes", always_four_bytes),
    refuses(check_decode_step_cost, "tied-embedding-twice", "counts a tied matrix once", tied_embedding_twice),
    refuses(check_decode_step_cost, "untied-embedding-read", "embedding is a lookup", untied_embedding_read),
    refuses(check_decode_step_cost, "gpt2-position-table-read", "position table", position_table_read),
    refuses(check_decode_step_cost, "not-a-pair", "a pair", lambda *args: 1.0),

    accepts(check_ridge_batch, "reference", RIGHT, FAKE_PROFILE, TINY, torch.float32),
    accepts(check_ridge_batch, "two-dtypes-reference", roofline.ridge_batch(TWO_DTYPES, TINY, "float32"),
            TWO_DTYPES, TINY, torch.float32),
    refuses(check_ridge_batch, "the-ridge-point", "ridge point", RIDGE, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "multiplied-not-divided", "multiplied where you should divide",
            RIDGE * FLOPS_PER_ROW / WEIGHT_BYTES, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "intensity-without-the-factor-2", "2 FLOPs per weight",
            RIDGE * WEIGHT_BYTES / roofline.matmul_params(TINY), FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "ridge-from-flops-alone", "not the FLOP/s alone",
            FAKE_PROFILE.flops["float32"] * WEIGHT_BYTES / FLOPS_PER_ROW, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "ridge-upside-down", "not bandwidth / peak",
            WEIGHT_BYTES / FLOPS_PER_ROW / RIDGE, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "parameters-not-bytes", "weight bytes = parameters x bytes per value",
            RIGHT / 4, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "bytes-per-value-twice", "already counts the bytes per value",
            RIGHT * 4, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "another-dtypes-peak", "use the float32 peak",
            roofline.ridge_batch(TWO_DTYPES, TINY, "float32") * 3, TWO_DTYPES, TINY, torch.float32),
    refuses(check_ridge_batch, "not-a-number", "a number", "many", FAKE_PROFILE, TINY, torch.float32),
    # the notebook asks at a context (its CONTEXT): each row's own cache enters the answer
    accepts(check_ridge_batch, "with-a-cache-reference", RIGHT_AT_CONTEXT, FAKE_PROFILE, TINY, torch.float32, CONTEXT),
    refuses(check_ridge_batch, "with-a-cache-the-empty-cache-answer", "empty-cache answer",
            RIGHT, FAKE_PROFILE, TINY, torch.float32, CONTEXT),
    refuses(check_ridge_batch, "with-a-cache-shared-by-the-rows", "not shared",
            RIDGE * (AT_CONTEXT.weight_bytes + AT_CONTEXT.kv_bytes) / AT_CONTEXT.flops,
            FAKE_PROFILE, TINY, torch.float32, CONTEXT),
    refuses(check_ridge_batch, "with-a-cache-without-attention-flops", "include attention",
            RIDGE * AT_CONTEXT.weight_bytes / (FLOPS_PER_ROW - RIDGE * AT_CONTEXT.kv_bytes),
            FAKE_PROFILE, TINY, torch.float32, CONTEXT),
    accepts(check_ridge_batch, "past-the-ridge-context-inf", float("inf"), FAKE_PROFILE, TINY, torch.float32,
            PAST_RIDGE_CONTEXT),
    refuses(check_ridge_batch, "past-the-ridge-context-a-number", "about inf", 1e6, FAKE_PROFILE, TINY,
            torch.float32, PAST_RIDGE_CONTEXT),

    refuses(check_step_bounds, "the-packages-own-function", "write the steps yourself", roofline.step_bounds),
    refuses(check_step_bounds, "the-packages-own-answer", "write the steps yourself",
            lambda rows, profile, slack=2.0: roofline.step_bounds(rows, profile, slack)),
    accepts(check_step_bounds, "by-hand", bounds_by_hand),
    accepts(check_step_bounds, "reference-on-a-sweep", bounds_by_hand, tiny_sweep(), TWO_DTYPES),
    refuses(check_step_bounds, "min-of-the-two-times", "slower of the two limits", _bounds(roof=min)),
    refuses(check_step_bounds, "sum-of-the-two-times", "not their sum", _bounds(roof=lambda m, c: m + c)),
    refuses(check_step_bounds, "memory-time-only", "past the ridge", _bounds(roof=lambda m, c: m)),
    refuses(check_step_bounds, "no-overhead-test", "first test", _bounds(overhead_test=False)),
    refuses(check_step_bounds, "inverted-overhead-test", "first test", inverted_overhead_test),
    refuses(check_step_bounds, "slack-ignored", "only beyond slack", _bounds(slack_used=1.0)),
    refuses(check_step_bounds, "slack-fixed-at-2", "use the slack argument", _bounds(slack_used=2.0)),
    refuses(check_step_bounds, "float32-peak-for-every-row", "each row's own dtype", _bounds(dtype="float32")),
    refuses(check_step_bounds, "short-labels", "use exactly the labels", short_labels),
    refuses(check_step_bounds, "not-a-list", "one label per row", lambda rows, profile, slack=2.0: "memory-bound"),
]


# --- mutation testing (scripts/checker_mutants.py) --------------------------------------------------

# exercise 2's answer is a value computed in the notebook: the embedded model's shape on a CPU whose
# float32 ridge (10 FLOP/byte) a batch reaches at the exercise's context of 256 (about 32 rows), so that
# the answer is finite and each slip shows
RIDGE_PROFILE = HardwareProfile(device="cpu", name="a 2-core CPU", bandwidth=20e9, flops={"float32": 200e9})
RIDGE_CONFIG = PRESETS["smollm2-135m"]

MUTATION_CALLS = {
    "ex2_ridge_batch": (lambda ns: ns.update(config=RIDGE_CONFIG, profile=RIDGE_PROFILE),
                        lambda ns: check_ridge_batch(ns["predicted_ridge_batch"], RIDGE_PROFILE, RIDGE_CONFIG,
                                                     torch.float32, context=ns["EXERCISE_CONTEXT"])),
}

EQUIVALENT_MUTANTS: dict[str, dict[str, str]] = {}
