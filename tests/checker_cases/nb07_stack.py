"""Checker cases of notebook 07 (putting it together): the reference and each typical mistake."""

from labsupport.checks.stack import (check_best_under_budget, check_ceiling, check_cumulative,
                                     reference_best_under_budget, reference_ceiling, reference_cumulative)

from labsupport.checks.stack_cost import check_decode_cost_model
from labsupport.lab.stack_cost import predict_tokens_per_s

from checker_cases.common import accepts, refuses


# --- notebook 07 (putting it together): how gains combine ----------------------------------

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
    out = reference_cumulative(rows)
    del out[rows[0]["stage"]]
    return out


# --- the fastest configuration under a memory budget ------------------------------------------

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
    name = reference_best_under_budget(rows, budget)
    return next((r for r in rows if r["stage"] == name), None)


# --- the decode cost model (exercise 4) -------------------------------------------------------

def cost(nbytes, bw_bytes_s, overhead_s, rows, passes):
    return rows / (passes * (nbytes / bw_bytes_s + overhead_s))


def ignores_the_batch(p, bits, rows, passes, bw, ms):
    return cost(p * bits / 8, bw * 1e9, ms / 1e3, 1, passes)


def ignores_the_overhead(p, bits, rows, passes, bw, ms):
    return cost(p * bits / 8, bw * 1e9, 0.0, rows, passes)


def fp32_bytes_always(p, bits, rows, passes, bw, ms):
    return cost(p * 4, bw * 1e9, ms / 1e3, rows, passes)


def bits_as_bytes(p, bits, rows, passes, bw, ms):
    return cost(p * bits, bw * 1e9, ms / 1e3, rows, passes)


def ignores_accepted_tokens(p, bits, rows, passes, bw, ms):
    return cost(p * bits / 8, bw * 1e9, ms / 1e3, rows, 1.0)


def multiplies_the_passes(p, bits, rows, passes, bw, ms):
    return rows * passes / (p * bits / 8 / (bw * 1e9) + ms / 1e3)


def gibibytes(p, bits, rows, passes, bw, ms):
    return cost(p * bits / 8, bw * 2**30, ms / 1e3, rows, passes)


def milliseconds_as_seconds(p, bits, rows, passes, bw, ms):
    return cost(p * bits / 8, bw * 1e9, ms, rows, passes)


def reference_predict(parameters, bits_per_weight, rows, passes_per_token, bandwidth_gb_s, overhead_ms):
    # the notebook's solution (the checker refuses a call of stack_cost.predict_tokens_per_s)
    seconds_per_pass = parameters * bits_per_weight / 8 / (bandwidth_gb_s * 1e9) + overhead_ms / 1000
    return rows / (passes_per_token * seconds_per_pass)


def seconds_per_token(p, bits, rows, passes, bw, ms):
    return 1 / reference_predict(p, bits, rows, passes, bw, ms)


def measured_inputs():
    """A made-up measured ladder: the reference explains the first two stages, not the third."""
    def stage(name, bits, rows, passes, measured):
        return {"stage": name, "parameters": 135e6, "bits_per_weight": bits, "rows": rows,
                "passes_per_token": passes, "measured": measured}
    return ([stage("+ KV cache", 32, 1, 1.02, 25.0), stage("+ static batching", 32, 8, 1.3, 120.0),
             stage("+ int4 weights", 5, 8, 1.3, 20.0)], 20.0, 10.0)


def special_cases_the_ladder(p, bits, rows, passes, bw, ms):   # right on the made-up stages only
    return reference_predict(p, bits, rows, passes, bw, ms) * (10 if p == 135e6 and ms == 10.0 else 1)


NOTEBOOK_07 = [
    accepts(check_cumulative, "reference", reference_cumulative),
    refuses(check_cumulative, "side-branch-compounded", "builds on B", multiply_in_order),
    refuses(check_cumulative, "gains-added", "do not add them", add_gains),
    refuses(check_cumulative, "own-gains", "own gain", own_gains),
    refuses(check_cumulative, "first-stage-left-out", "first stage belongs", without_first),
    refuses(check_cumulative, "a-list", "one entry per stage",
            lambda rows: list(reference_cumulative(rows).values())),
    accepts(check_ceiling, "reference", reference_ceiling),
    refuses(check_ceiling, "one-row", "multiply by the batch size", lambda bw, w, b: bw / w),
    refuses(check_ceiling, "divides-by-the-batch", "do not divide", lambda bw, w, b: bw / (w * b)),
    refuses(check_ceiling, "bits", "no factor of 8", lambda bw, w, b: b * bw / (8 * w)),
    refuses(check_ceiling, "seconds-per-step", "its inverse", lambda bw, w, b: w / bw),
    refuses(check_ceiling, "text", "a float", lambda bw, w, b: "fast"),
    accepts(check_best_under_budget, "reference", reference_best_under_budget),
    refuses(check_best_under_budget, "ignores-the-budget", "does not fit the budget", ignores_budget),
    refuses(check_best_under_budget, "weights-only", "KV cache needs memory too", weights_only),
    refuses(check_best_under_budget, "strictly-below", "<=, not <", strictly_below),
    refuses(check_best_under_budget, "smallest-not-fastest", "pick the fastest", smallest),
    refuses(check_best_under_budget, "by-gain", "not gain", by_gain),
    refuses(check_best_under_budget, "nothing-fits-raises", "return None", max_of_nothing),
    refuses(check_best_under_budget, "peer-not-skipped", "skip them", keeps_the_peer),
    refuses(check_best_under_budget, "whole-row", "stage's name", whole_row),
    accepts(check_decode_cost_model, "reference", reference_predict),
    accepts(check_decode_cost_model, "reference-on-a-ladder", reference_predict, *measured_inputs()),
    refuses(check_decode_cost_model, "the-packages-own-function", "write the steps yourself", predict_tokens_per_s),
    refuses(check_decode_cost_model, "the-packages-own-answer", "write the steps yourself",
            lambda *args: predict_tokens_per_s(*args)),
    refuses(check_decode_cost_model, "ignores-the-batch", "multiply by rows", ignores_the_batch),
    refuses(check_decode_cost_model, "ignores-the-overhead", "overhead counts too", ignores_the_overhead),
    refuses(check_decode_cost_model, "fp32-bytes-always", "this stage's precision", fp32_bytes_always),
    refuses(check_decode_cost_model, "bits-as-bytes", "divide by 8", bits_as_bytes),
    refuses(check_decode_cost_model, "ignores-accepted-tokens", "speculation accepts", ignores_accepted_tokens),
    refuses(check_decode_cost_model, "multiplies-the-passes", "do not multiply", multiplies_the_passes),
    refuses(check_decode_cost_model, "gibibytes", "GiB", gibibytes),
    refuses(check_decode_cost_model, "milliseconds-as-seconds", "divide by 1000 for seconds",
            milliseconds_as_seconds),
    refuses(check_decode_cost_model, "seconds-per-token", "not seconds per token", seconds_per_token),
    refuses(check_decode_cost_model, "text", "return a float", lambda *a: "fast"),
    refuses(check_decode_cost_model, "raises", "six numbers", lambda p, bits: p),
    refuses(check_decode_cost_model, "special-cases-the-ladder", "within 2x", special_cases_the_ladder,
            *measured_inputs()),
]
