"""Checker cases of notebook 07 (putting it together): the notebook's solutions (written out here: no row's
answer calls the package), each typical mistake, and the package's own answers, however a learner's
function holds them (all refused)."""

import statistics

import numpy as np

from labsupport.checks.stack import (check_best_under_budget, check_ceiling, check_cumulative,
                                     reference_best_under_budget, reference_ceiling, reference_cumulative)
from labsupport.checks.stack_cost import _slip_model, check_decode_cost_model
from labsupport.lab.speculative_math import expected_tokens_per_call
from labsupport.lab.stack import best_under_budget as package_best_under_budget
from labsupport.lab.stack_cost import cost_model, fit_overhead, predict_tokens_per_s

from checker_cases.common import accepts, refuses
from checker_cases.nb06_serving import OWN_CODE, refuses_held


# --- notebook 07 (putting it together): how gains combine ----------------------------------

def cumulative(rows):                          # the notebook's solution
    total = {}
    for row in rows:
        total[row["stage"]] = 1.0 if row["builds_on"] is None else total[row["builds_on"]] * row["gain"]
    return total


def multiply_in_order(rows):                   # compounds the side branch too
    out, total = {}, 1.0
    for r in rows:
        total *= r["gain"] or 1.0
        out[r["stage"]] = total
    return out


def add_gains(rows):                           # 3x then 2x taken as 5x
    out = {}
    for r in rows:
        out[r["stage"]] = 1.0 if r["builds_on"] is None else out[r["builds_on"]] + r["gain"]
    return out


def own_gains(rows):                           # each stage's gain over the one before, not over the first
    return {r["stage"]: 1.0 if r["builds_on"] is None else r["gain"] for r in rows}


def without_first(rows):
    out = cumulative(rows)
    del out[rows[0]["stage"]]
    return out


# --- the ceiling that fewer bytes raise -------------------------------------------------------

def ceiling(bandwidth_bytes_per_s, weight_bytes, batch):          # the notebook's solution
    return batch * bandwidth_bytes_per_s / weight_bytes


def ceiling_of_the_cost_model(bandwidth_bytes_per_s, weight_bytes, batch):
    """The lab's cost model with no overhead, 8 bits per weight (refused: its copy of the formula)."""
    return predict_tokens_per_s(weight_bytes, 8, batch, 1.0, bandwidth_bytes_per_s / 1e9, 0.0)


# --- the fastest configuration under a memory budget ------------------------------------------

def best_under_budget(rows, budget_bytes):     # the notebook's solution
    fitting = [r for r in rows if r["weight_bytes"] is not None
               and r["weight_bytes"] + r["kv_cache_bytes"] <= budget_bytes]
    if not fitting:
        return None
    return max(fitting, key=lambda r: r["tokens_per_s"])["stage"]


def _ours(rows):
    return [r for r in rows if r.get("weight_bytes") is not None]


def _fastest(rows, key="tokens_per_s"):
    rows = [r for r in rows if r[key] is not None]
    return max(rows, key=lambda r: r[key])["stage"] if rows else None


def memory(r):
    return r["weight_bytes"] + r["kv_cache_bytes"]


def ignores_budget(rows, budget):
    return _fastest(_ours(rows))


def weights_only(rows, budget):
    return _fastest([r for r in _ours(rows) if r["weight_bytes"] <= budget])


def strictly_below(rows, budget):
    return _fastest([r for r in _ours(rows) if memory(r) < budget])


def smallest(rows, budget):
    fits = [r for r in _ours(rows) if memory(r) <= budget]
    return min(fits, key=memory)["stage"] if fits else None


def by_gain(rows, budget):
    return _fastest([r for r in _ours(rows) if memory(r) <= budget], key="gain")


def max_of_nothing(rows, budget):              # max() of an empty list raises
    return max((r for r in _ours(rows) if memory(r) <= budget), key=lambda r: r["tokens_per_s"])["stage"]


def keeps_the_peer(rows, budget):              # None + None raises on Hugging Face's row
    return max((r for r in rows if r["weight_bytes"] + r["kv_cache_bytes"] <= budget),
               key=lambda r: r["tokens_per_s"], default={"stage": None})["stage"]


def whole_row(rows, budget):
    name = best_under_budget(rows, budget)
    return next((r for r in rows if r["stage"] == name), None)


# --- the decode cost model (exercise 4) -------------------------------------------------------

def spec_passes(alpha, k):                     # the notebook's solution: 1 + alpha + ... + alpha^k tokens a pass
    return 1 / sum(alpha ** i for i in range(k + 1))


def model(unit=1e9, weight_bytes=lambda s: s["parameters"] * s["bits_per_weight"] / 8, subtract=True,
          fit=statistics.median, clamp=True, overhead_scale=1.0, use_rows=True, passes="divide",
          spec=spec_passes, invert=False, split=False):
    """The notebook's solution, or with one thing changed: a learner's cost_model(stages, bandwidth_gb_s).
    split: the median of the seconds minus the median of the bytes' times."""
    def cost_model(stages, bandwidth_gb_s):
        def reading(s):
            return weight_bytes(s) / (bandwidth_gb_s * unit)
        overhead = fit([s["seconds_per_pass"] - (reading(s) if subtract else 0.0) for s in stages])
        if split:
            overhead = fit([s["seconds_per_pass"] for s in stages]) - fit([reading(s) for s in stages])
        overhead = max(0.0, overhead) if clamp else overhead

        def predict(stage):
            p = stage["passes_per_token"]
            if p is None:
                p = spec(stage["alpha"], stage["k"])
            p = {"divide": p, "ignore": 1.0, "multiply": 1 / p}[passes]
            tokens_per_s = (stage["rows"] if use_rows else 1) / (p * (reading(stage) + overhead_scale * overhead))
            return 1 / tokens_per_s if invert else tokens_per_s
        return predict
    return cost_model


solution_cost_model = model()                 # the notebook's solution


def closed_form_at_alpha_one(alpha, k):        # right but at alpha = 1, where it divides by zero
    return (1 - alpha) / (1 - alpha ** (k + 1))


def numpy_at_alpha_one(alpha, k):              # numpy's 0 / 0 at alpha = 1 is nan, not an error
    alpha = np.float64(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1 - alpha) / (1 - alpha ** (k + 1))


def fits_from_measured(stages, bandwidth_gb_s):  # time per pass from tokens/s: None passes for speculation
    for s in stages:
        s["seconds_per_pass"] = s["rows"] / (s["passes_per_token"] * s["measured"])
    return solution_cost_model(stages, bandwidth_gb_s)


def own_timing(stages, bandwidth_gb_s):        # predicts each stage from its own measured time
    def predict(stage):
        return stage["rows"] / (stage["passes_per_token"] * stage["seconds_per_pass"])
    return predict


def packages_overhead(stages, bandwidth_gb_s):  # its own prediction, the package's fit
    return model(fit=lambda beyond: fit_overhead(stages, bandwidth_gb_s) / 1e3)(stages, bandwidth_gb_s)


def returns_a_number(stages, bandwidth_gb_s):
    return solution_cost_model(stages, bandwidth_gb_s)(stages[0])


def measured_inputs():
    """A made-up measured ladder: the reference explains the first two stages and speculation, not int4."""
    def stage(name, bits, rows, passes, measured, seconds, alpha=None, k=None):
        return {"stage": name, "parameters": 135e6, "bits_per_weight": bits, "rows": rows,
                "passes_per_token": passes, "alpha": alpha, "k": k, "measured": measured,
                "seconds_per_pass": seconds, "counted_passes_per_token": passes or 0.9}
    return ([stage("+ KV cache", 32, 1, 1.02, 25.0, 0.039), stage("+ static batching", 32, 8, 1.3, 120.0, 0.05),
             stage("+ int4 weights", 5, 8, 1.3, 20.0, 0.3),
             stage("+ speculative decoding", 5, 1, None, 40.0, 0.022, alpha=0.4, k=4)], 20.0)


def special_cases_the_ladder(stages, bandwidth_gb_s):       # right on the made-up ladders only
    predict = solution_cost_model(stages, bandwidth_gb_s)
    return lambda stage: predict(stage) * (10 if stage["stage"].startswith("+ ") else 1)


def split_medians(stages, bandwidth_gb_s):     # the median of the seconds minus the median of the bytes' times
    return model(fit=statistics.median, split=True)(stages, bandwidth_gb_s)


NOTEBOOK_07 = [
    accepts(check_cumulative, "the-notebooks-solution", cumulative),
    refuses(check_cumulative, "the-checkers-reference", OWN_CODE, reference_cumulative),
    *refuses_held(check_cumulative, "the-checkers-reference", reference_cumulative),
    refuses(check_cumulative, "side-branch-compounded", "builds on B", multiply_in_order),
    refuses(check_cumulative, "gains-added", "do not add them", add_gains),
    refuses(check_cumulative, "own-gains", "own gain", own_gains),
    refuses(check_cumulative, "first-stage-left-out", "first stage belongs", without_first),
    refuses(check_cumulative, "a-list", "one entry per stage",
            lambda rows: list(cumulative(rows).values())),
    accepts(check_ceiling, "the-notebooks-solution", ceiling),
    refuses(check_ceiling, "the-checkers-reference", OWN_CODE, reference_ceiling),
    *refuses_held(check_ceiling, "the-checkers-reference", reference_ceiling),
    refuses(check_ceiling, "the-labs-cost-model", "predict_tokens_per_s", ceiling_of_the_cost_model),
    refuses(check_ceiling, "one-row", "multiply by the batch size", lambda bw, w, b: bw / w),
    refuses(check_ceiling, "divides-by-the-batch", "do not divide", lambda bw, w, b: bw / (w * b)),
    refuses(check_ceiling, "bits", "no factor of 8", lambda bw, w, b: b * bw / (8 * w)),
    refuses(check_ceiling, "seconds-per-step", "its inverse", lambda bw, w, b: w / bw),
    refuses(check_ceiling, "text", "a float", lambda bw, w, b: "fast"),
    accepts(check_best_under_budget, "the-notebooks-solution", best_under_budget),
    refuses(check_best_under_budget, "the-labs-best_under_budget", "lab.stack.best_under_budget",
            package_best_under_budget),
    *refuses_held(check_best_under_budget, "the-labs-best_under_budget", package_best_under_budget),
    refuses(check_best_under_budget, "the-checkers-reference", OWN_CODE, reference_best_under_budget),
    refuses(check_best_under_budget, "ignores-the-budget", "does not fit the budget", ignores_budget),
    refuses(check_best_under_budget, "weights-only", "KV cache needs memory too", weights_only),
    refuses(check_best_under_budget, "strictly-below", "<=, not <", strictly_below),
    refuses(check_best_under_budget, "smallest-not-fastest", "pick the fastest", smallest),
    refuses(check_best_under_budget, "by-gain", "not gain", by_gain),
    refuses(check_best_under_budget, "nothing-fits-raises", "return None", max_of_nothing),
    refuses(check_best_under_budget, "peer-not-skipped", "skip them", keeps_the_peer),
    refuses(check_best_under_budget, "whole-row", "stage's name", whole_row),
    accepts(check_decode_cost_model, "the-notebooks-solution", solution_cost_model),
    accepts(check_decode_cost_model, "the-notebooks-solution-on-a-ladder", solution_cost_model, *measured_inputs()),
    accepts(check_decode_cost_model, "closed-form-with-alpha-one", model(spec=lambda a, k: 1 / (k + 1) if a == 1 else
                                                                           (1 - a) / (1 - a ** (k + 1)))),
    refuses(check_decode_cost_model, "the-labs-cost_model", "lab.stack_cost.cost_model", cost_model),
    refuses(check_decode_cost_model, "a-call-of-the-labs-cost_model", OWN_CODE,
            lambda stages, bw: cost_model(stages, bw)),
    *refuses_held(check_decode_cost_model, "the-labs-cost_model", cost_model),
    refuses(check_decode_cost_model, "the-labs-overhead", "fit_overhead", packages_overhead),
    refuses(check_decode_cost_model, "the-checkers-slip-model", "_slip_model",
            lambda stages, bw: _slip_model(stages, bw)),
    refuses(check_decode_cost_model, "notebook-05s-package-formula", "expected_tokens_per_call",
            model(spec=lambda a, k: 1 / expected_tokens_per_call(a, k))),
    refuses(check_decode_cost_model, "upper-median", "not the upper one", model(fit=statistics.median_high)),
    refuses(check_decode_cost_model, "lower-median", "not the lower one", model(fit=statistics.median_low)),
    refuses(check_decode_cost_model, "difference-of-medians", "median of the differences", split_medians),
    refuses(check_decode_cost_model, "trimmed-mean", "the median of what each pass took",
            model(fit=lambda x: statistics.fmean(sorted(x)[1:-1]))),
    refuses(check_decode_cost_model, "bytes-not-subtracted", "subtract the bytes' time", model(subtract=False)),
    refuses(check_decode_cost_model, "no-overhead", "add the overhead to every pass", model(overhead_scale=0.0)),
    refuses(check_decode_cost_model, "milliseconds-added-to-seconds", "keep the overhead in seconds",
            model(overhead_scale=1e3)),
    refuses(check_decode_cost_model, "overhead-divided-by-1000", "do not divide the overhead by 1000",
            model(overhead_scale=1e-3)),
    refuses(check_decode_cost_model, "gibibytes", "GiB", model(unit=2**30)),
    refuses(check_decode_cost_model, "gigabytes-not-bytes", "multiply it by 1e9", model(unit=1.0)),
    refuses(check_decode_cost_model, "bits-as-bytes", "divide by 8", model(weight_bytes=lambda s: s["parameters"]
                                                                             * s["bits_per_weight"])),
    refuses(check_decode_cost_model, "fp32-bytes-always", "its own precision",
            model(weight_bytes=lambda s: s["parameters"] * 4)),
    refuses(check_decode_cost_model, "ignores-the-batch", "multiply by rows", model(use_rows=False)),
    refuses(check_decode_cost_model, "ignores-the-passes", "divide by it", model(passes="ignore")),
    refuses(check_decode_cost_model, "multiplies-the-passes", "do not multiply", model(passes="multiply")),
    refuses(check_decode_cost_model, "seconds-per-token", "not seconds per token", model(invert=True)),
    refuses(check_decode_cost_model, "mean-fit", "not the mean", model(fit=statistics.fmean)),
    refuses(check_decode_cost_model, "smallest-fit", "not the smallest", model(fit=min)),
    refuses(check_decode_cost_model, "negative-overhead", "never negative", model(clamp=False)),
    refuses(check_decode_cost_model, "tokens-per-pass", "not the tokens per pass",
            model(spec=lambda a, k: sum(a ** i for i in range(k + 1)))),
    refuses(check_decode_cost_model, "target-token-forgotten", "count the target's own token",
            model(spec=lambda a, k: 1 / sum(a ** i for i in range(k)))),
    refuses(check_decode_cost_model, "endless-drafts", "1 / \\(1 - alpha\\) is its limit", model(spec=lambda a, k: 1 - a)),
    refuses(check_decode_cost_model, "linear-in-alpha", "not 1 \\+ k x alpha", model(spec=lambda a, k: 1 / (1 + k * a))),
    refuses(check_decode_cost_model, "every-draft-kept", "only at alpha = 1", model(spec=lambda a, k: 1 / (k + 1))),
    refuses(check_decode_cost_model, "speculation-ignored", "fewer than 1 pass per token",
            model(spec=lambda a, k: 1.0)),
    refuses(check_decode_cost_model, "other-speculation-slip", "the plain stages are right",
            model(spec=lambda a, k: 1 / (1 + a + a * a))),
    refuses(check_decode_cost_model, "alpha-one-divides-by-zero", "At alpha = 1 every draft is kept",
            model(spec=closed_form_at_alpha_one)),
    refuses(check_decode_cost_model, "alpha-one-gives-nan", "at alpha = 1 every draft is kept",
            model(spec=numpy_at_alpha_one)),
    refuses(check_decode_cost_model, "fits-from-measured", "passes_per_token None", fits_from_measured),
    refuses(check_decode_cost_model, "own-timing", "never measured", own_timing),
    refuses(check_decode_cost_model, "returns-a-number", "return predict", returns_a_number),
    refuses(check_decode_cost_model, "text", "returns a float", lambda stages, bw: lambda stage: "fast"),
    refuses(check_decode_cost_model, "raises", "in cost_model", lambda stages: stages),
    refuses(check_decode_cost_model, "special-cases-the-ladder", "within 2x", special_cases_the_ladder,
            *measured_inputs()),
]


# --- mutation testing (scripts/checker_mutants.py) --------------------------------------------------

EQUIVALENT_MUTANTS: dict[str, dict[str, str]] = {
    "stack-cost-model": {
        "20:15:swap-arguments:0<->1": "max(0.0, m) and max(m, 0.0) are the same number (the median of finite times "
                                      "is never NaN).",
        "20:19:constant:0.0*2": "0.0 * 2 is 0.0: the clamp is the same.",
    },
}
