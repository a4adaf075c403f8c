"""Checker cases of notebook 07 (putting it together): the reference and each typical mistake."""

from labsupport.checks.stack import (check_best_under_budget, check_ceiling, check_cumulative,
                                     reference_best_under_budget, reference_ceiling, reference_cumulative)

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
]
