"""Checker cases of notebook 00 (where the time goes): the reference and each typical mistake."""

from typing import NamedTuple

import torch

import labsupport as ls
from labsupport.lab import roofline
from labsupport.checks import roofline as roofline_checks
from labsupport.checks.roofline import check_decode_step_cost, check_ridge_batch, check_step_bounds
from labsupport.engine.kv_cache import kv_cache_bytes
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


def matmul_weights(config, head_dim=None):
    """Every layer's q, k, v, o and MLP matrices, and lm_head: counted from the fields."""
    h, i, d = config.hidden_size, config.intermediate_size, head_dim or config.head_dim
    q_size, kv_size = config.num_heads * d, config.num_kv_heads * d
    per_layer = h * (q_size + 2 * kv_size) + q_size * h + (3 if config.family == "llama" else 2) * h * i
    return config.num_layers * per_layer + config.vocab_size * h


def by_hand(config, batch, context, size, head_dim=None):
    """The notebook's solution, written out without the package: counted, not copied (the bytes read are the
    matmul weights: norms and biases may be left out)."""
    d = head_dim or config.head_dim
    flops = 2 * matmul_weights(config, d) * batch + 4 * config.num_layers * config.num_heads * d * context * batch
    kv_values = config.num_layers * 2 * config.num_kv_heads * d * context * batch
    return flops, (matmul_weights(config, d) + kv_values) * size


def with_norms_and_biases(config, batch, context, size):
    """The exact parameter count read (norms and biases too), from the fields: accepted as well."""
    flops, nbytes = by_hand(config, batch, context, size)
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_layers
    # llama: two RMSNorm weights a layer and the final one; gpt2: q, k, v, o and MLP biases, two LayerNorms
    # (weight and bias) a layer, and the final one
    small = layers * 2 * h + h if config.family == "llama" else layers * (4 * h + i + h + 4 * h) + 2 * h
    return flops, nbytes + small * size


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
one_flop_per_weight = _with(flops=lambda c, b, n, s, cost: matmul_weights(c) * b
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


def head_dim_from_hidden_size(config, batch, context, size):
    """head_dim = hidden_size // num_heads: right on every config but one with wider heads."""
    return by_hand(config, batch, context, size, head_dim=config.hidden_size // config.num_heads)


# Ways of holding the package's answer, each refused (grading by reach: labsupport/checks/grading.py).

def decode_cost_by_default(config, batch, context, size, _cost=roofline.decode_step_cost):
    cost = _cost(config, batch, context, size)
    return cost.flops, cost.bytes


def _decode_cost_in_a_closure():
    cost_of = roofline.decode_step_cost

    def step_cost(config, batch, context, size):
        cost = cost_of(config, batch, context, size)
        return cost.flops, cost.bytes
    return step_cost


def through_a_helper(config, batch, context, size):
    return decode_cost(config, batch, context, size)


def _kv_values(config, batch, context):
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * context * batch


# The config's own cost model, one method or property at a time: each computes part of the answer.
CONFIG_COSTS = {
    "decode_flops": lambda c, b, n, s: (c.decode_flops(b, n), by_hand(c, b, n, s)[1]),
    "attention_flops": lambda c, b, n, s: (2 * matmul_weights(c) * b + c.attention_flops(b, n), by_hand(c, b, n, s)[1]),
    "matmul_params": lambda c, b, n, s: (by_hand(c, b, n, s)[0], (c.matmul_params + _kv_values(c, b, n)) * s),
    "params_read_per_step": lambda c, b, n, s: (by_hand(c, b, n, s)[0],
                                                (c.params_read_per_step + _kv_values(c, b, n)) * s),
    "num_parameters": lambda c, b, n, s: (by_hand(c, b, n, s)[0], (c.num_parameters + _kv_values(c, b, n)) * s),
    "kv_values_per_token": lambda c, b, n, s: (by_hand(c, b, n, s)[0],
                                               (matmul_weights(c) + c.kv_values_per_token * n * b) * s),
}


def the_engines_cache_bytes(config, batch, context, size):
    flops = by_hand(config, batch, context, size)[0]
    return flops, matmul_weights(config) * size + kv_cache_bytes(config, context, batch, size)


def the_checkers_own_helper(config, batch, context, size):
    kv_attention = roofline_checks._attention_with_kv_heads(config, batch, context)
    flops = 2 * matmul_weights(config) * batch + kv_attention * config.num_heads // config.num_kv_heads
    return flops, by_hand(config, batch, context, size)[1]


def the_lab_modules_copies(config, batch, context, size):
    flops = 2 * roofline.matmul_params(config) * batch + roofline.attention_flops(config, batch, context)
    return flops, by_hand(config, batch, context, size)[1]


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


def roofline_time(row, profile):
    return max(row["bytes"] / profile.bandwidth, row["flops"] / profile.flops[row["dtype"]])


def inverted_overhead_test(rows, profile, slack=2.0):
    return ["overhead-bound" if slack * row["seconds"] < roofline_time(row, profile) else
            "memory-bound" if row["intensity"] < profile.ridge(row["dtype"]) else "compute-bound" for row in rows]


def overhead_at_the_boundary(rows, profile, slack=2.0):          # >= where the exercise says more than
    return ["overhead-bound" if row["seconds"] >= slack * roofline_time(row, profile) else
            "memory-bound" if row["intensity"] < profile.ridge(row["dtype"]) else "compute-bound" for row in rows]


def memory_bound_at_the_ridge(rows, profile, slack=2.0):         # <= where the exercise says below
    return ["overhead-bound" if row["seconds"] > slack * roofline_time(row, profile) else
            "memory-bound" if row["intensity"] <= profile.ridge(row["dtype"]) else "compute-bound" for row in rows]


def bounds_from_attainable(rows, profile, slack=2.0):            # the profile's own roofline
    return ["overhead-bound" if row["seconds"] > slack * row["flops"] / profile.attainable(row["intensity"],
                                                                                          row["dtype"])
            else "memory-bound" if row["intensity"] < profile.ridge(row["dtype"]) else "compute-bound"
            for row in rows]


def bounds_from_the_lab_roofline_time(rows, profile, slack=2.0):
    return ["overhead-bound" if row["seconds"] > slack * roofline.roofline_seconds(row, profile)
            else "memory-bound" if row["intensity"] < profile.ridge(row["dtype"]) else "compute-bound"
            for row in rows]


def bounds_by_default(rows, profile, slack=2.0, _bounds=roofline.step_bounds):
    return _bounds(rows, profile, slack)


def _bounds_in_a_closure():
    bounds = roofline.step_bounds
    return lambda rows, profile, slack=2.0: bounds(rows, profile, slack)


def bounds_through_a_helper(rows, profile, slack=2.0):
    return bounds_by_default(rows, profile, slack)


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


OWN_CODE = "expected your own code, got a call of the package's"

NOTEBOOK_00 = [
    refuses(check_decode_step_cost, "the-packages-own-answer", OWN_CODE, decode_cost),
    refuses(check_decode_step_cost, "the-packages-own-answer-as-a-default-argument", "default argument",
            decode_cost_by_default),
    refuses(check_decode_step_cost, "the-packages-own-answer-in-a-closure", "closure", _decode_cost_in_a_closure()),
    refuses(check_decode_step_cost, "the-packages-own-answer-through-a-helper", "through_a_helper -> decode_cost",
            through_a_helper),
    *[refuses(check_decode_step_cost, f"the-configs-{name.replace('_', '-')}", f"ModelConfig.{name}", answer)
      for name, answer in CONFIG_COSTS.items()],
    refuses(check_decode_step_cost, "the-engines-cache-bytes", "kv_cache_bytes", the_engines_cache_bytes),
    refuses(check_decode_step_cost, "the-checkers-own-helper", "checks.roofline._attention_with_kv_heads",
            the_checkers_own_helper),
    refuses(check_decode_step_cost, "the-lab-modules-copies", "lab.roofline.(matmul_params|attention_flops)",
            the_lab_modules_copies),
    refuses(check_decode_step_cost, "a-built-name-the-walk-cannot-see", "ModelConfig.num_parameters",
            lambda c, b, n, s: (by_hand(c, b, n, s)[0], getattr(c, "num_" + "parameters".strip()) * s)),
    accepts(check_decode_step_cost, "counted-by-hand", by_hand),
    accepts(check_decode_step_cost, "with-norms-and-biases", with_norms_and_biases),
    refuses(check_decode_step_cost, "head-dim-from-hidden-size", "config.head_dim", head_dim_from_hidden_size),
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
    refuses(check_decode_step_cost, "tied-embedding-twice", "one matrix", tied_embedding_twice),
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

    refuses(check_ridge_batch, "the-packages-function-as-the-answer", OWN_CODE, roofline.ridge_batch,
            FAKE_PROFILE, TINY, torch.float32),

    refuses(check_step_bounds, "the-packages-own-function", OWN_CODE, roofline.step_bounds),
    refuses(check_step_bounds, "the-packages-own-answer", OWN_CODE,
            lambda rows, profile, slack=2.0: roofline.step_bounds(rows, profile, slack)),
    refuses(check_step_bounds, "the-packages-own-answer-as-a-default-argument", "default argument",
            bounds_by_default),
    refuses(check_step_bounds, "the-packages-own-answer-in-a-closure", "closure", _bounds_in_a_closure()),
    refuses(check_step_bounds, "the-packages-own-answer-through-a-helper", "bounds_through_a_helper",
            bounds_through_a_helper),
    refuses(check_step_bounds, "the-profiles-attainable", "HardwareProfile.attainable", bounds_from_attainable),
    refuses(check_step_bounds, "the-lab-modules-roofline-time", "lab.roofline.roofline_seconds",
            bounds_from_the_lab_roofline_time),
    refuses(check_step_bounds, "the-checkers-own-slip-helper", "checks.roofline",
            roofline_checks._bounds_with(max)),
    refuses(check_step_bounds, "through-ls", "lab.roofline.step_bounds",
            lambda rows, profile, slack=2.0: ls.lab.roofline.step_bounds(rows, profile, slack)),
    refuses(check_step_bounds, "overhead-at-exactly-slack-times-the-roof", "only more than that",
            overhead_at_the_boundary),
    refuses(check_step_bounds, "memory-bound-at-the-ridge", "exactly at the ridge is compute-bound",
            memory_bound_at_the_ridge),
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

# Exercise 2 is a value, computed once on the profile this notebook measured: the checker gets a number and
# cannot try the solution on another profile. Its three boundary mutants differ from the solution only where the
# shortfall (one row's FLOPs - ridge x its cache bytes, some 1e8 FLOPs on a real machine) is within one FLOP of 0,
# where the ridge batch is infinite either way. Exercise 3's is max's argument order.
EQUIVALENT_MUTANTS: dict[str, dict[str, str]] = {
    "ex2_ridge_batch": {
        "7:68:compare:0-Gt->GtE": "shortfall >= 0 for > 0: differs only at a shortfall of exactly 0.0 (a division "
                                  "by zero instead of inf), which the measured profile of a value exercise never gives",
        "7:80:constant:0+1": "shortfall > 1 for > 0: differs only for a shortfall in (0, 1] FLOP (inf instead of "
                             "a ridge batch of over 1e9 rows), which the measured profile of a value exercise never "
                             "gives",
        "7:80:constant:0-1": "shortfall > -1 for > 0: differs only for a shortfall in (-1, 0] FLOP, which the "
                             "measured profile of a value exercise never gives",
    },
    "ex3_step_bounds": {
        "7:36:swap-arguments:0<->1": "max(compute_seconds, memory_seconds) for max(memory_seconds, compute_seconds): "
                                     "max of two finite floats does not depend on their order",
    },
}
