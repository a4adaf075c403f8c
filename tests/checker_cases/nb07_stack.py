"""Checker cases of notebook 07 (putting it together): the reference and each typical mistake."""

from labsupport.checks.stack import check_ceiling, check_cumulative, reference_ceiling, reference_cumulative

from checker_cases.common import accepts, refuses


# --- notebook 07 (putting it together) ----------------------------------------------------

def multiply_in_order(rows):                   # compounds the side branch too
    out, total = {}, 1.0
    for r in rows:
        total *= r["gain"] or 1.0
        out[r["stage"]] = total
    return out


NOTEBOOK_07 = [
    accepts(check_cumulative, "reference", reference_cumulative),
    refuses(check_cumulative, "side-branch-compounded", "builds on B", multiply_in_order),
    refuses(check_cumulative, "a-list", "one entry per stage",
            lambda rows: list(reference_cumulative(rows).values())),
    accepts(check_ceiling, "reference", reference_ceiling),
    refuses(check_ceiling, "one-row", "multiply by the batch size", lambda bw, w, b: bw / w),
    refuses(check_ceiling, "bits", "no factor of 8", lambda bw, w, b: b * bw / (8 * w)),
]
