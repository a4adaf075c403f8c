"""Checker for notebook 07's exercise 4: a cost model that predicts every stage's decode tokens/s.

Introduced in notebook 07 (putting it together). The learner's function is compared with
the reference (`lab.stack_cost.predict_tokens_per_s`) on made-up stages, exactly, with
inputs chosen so that each usual slip gives another number (the batch, the overhead, the
precision's bytes, speculation's passes, GB against GiB, ms against s); then with this
run's measured ladder, within `TOLERANCE` (a factor), on the stages the model explains.
"""

from __future__ import annotations

import math

from ..lab.stack_cost import GB, TOLERANCE, explained, predict_ladder, predict_tokens_per_s
from . import call_learner, close_enough, fail, grades_quietly, passed, refuses_references

COST = "the decode cost model"

# (parameters, bits_per_weight, rows, passes_per_token, bandwidth_gb_s, overhead_ms)
CASES = [
    (135e6, 16, 4, 1.25, 20.0, 6.0),        # batched bf16 on a CPU: every slip gives another number
    (135e6, 32, 1, 1.02, 20.0, 6.0),        # fp32 at batch 1, prefill included
    (135e6, 5.0, 1, 0.4, 20.0, 6.0),        # int4 with speculation: 2.5 tokens per pass
    (1.7e9, 16, 16, 1.1, 3000.0, 0.08),     # a GPU: 16 rows, a small overhead
]


def _slips(parameters, bits, rows, passes, bandwidth, overhead) -> list[tuple[float, str]]:
    """(what each usual slip answers, its hint) for one case."""
    def model(nbytes=parameters * bits / 8, bw=bandwidth * GB, over=overhead / 1e3, r=rows, p=passes):
        return r / (p * (nbytes / bw + over))
    return [
        (model(r=1), "one pass serves every row of the batch: multiply by rows (tokens per pass = rows / "
                     "passes_per_token)."),
        (model(over=0.0), "the overhead counts too: seconds per pass = bytes / bandwidth + overhead."),
        (model(nbytes=parameters * 4), "read the weights in this stage's precision: bytes = parameters x "
                                       "bits_per_weight / 8, not 4 bytes (fp32) for every stage."),
        (model(nbytes=parameters * bits), "bits_per_weight is in bits: divide by 8 for bytes."),
        (model(p=1.0), "each sequence takes passes_per_token passes per token (speculation accepts several "
                       "tokens per pass, so fewer than 1): divide by it."),
        (rows * passes / (parameters * bits / 8 / (bandwidth * GB) + overhead / 1e3),
         "passes_per_token is passes per token: divide by it, do not multiply."),
        (model(bw=bandwidth * 2**30), "a GB is 10**9 bytes (a GiB, 2**30, is 7% more): bandwidth x 1e9."),
        (model(over=overhead), "the overhead is in milliseconds: divide by 1000 for seconds."),
        (model(over=overhead / 1e6), "the overhead is in milliseconds: divide by 1000 (not 10**6) for seconds."),
        (1 / model(), "return tokens per second, not seconds per token."),
    ]


def _number(exercise: str, value, case: str) -> float:
    """`value` as a float, or CheckFailed saying that a number was expected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        fail(exercise, "a number of tokens per second", repr(value)[:60], f"return a float. Case: {case}")
    value = float(value)
    if not math.isfinite(value):
        fail(exercise, "a finite number of tokens per second", value, f"check for a division by zero. Case: {case}")
    return value


@grades_quietly
@refuses_references("decode cost model", predict_tokens_per_s)
def check_decode_cost_model(fn, inputs: list[dict] | None = None, bandwidth_gb_s: float | None = None,
                            overhead_ms: float | None = None) -> None:
    """Check `fn(parameters, bits_per_weight, rows, passes_per_token, bandwidth_gb_s, overhead_ms) -> tokens/s`.

    Introduced in notebook 07 (putting it together). First exactly (to 1e-6) against the
    reference on made-up stages, with a hint for each usual slip; then, given this run's
    `stack_cost.cost_inputs`, bandwidth and fitted overhead, against the measured ladder:
    within TOLERANCE (2x) on every stage where the reference is (the model is simple: the
    stages it misses are reported, not graded).
    """
    for args in CASES:
        case = ("parameters {:.3g}, {} bits, {} rows, {} passes per token, {} GB/s, {} ms".format(*args))
        want = predict_tokens_per_s(*args)
        got = _number(COST, call_learner(COST, f"{want:.4g} tokens/s", "the function raised: it gets six numbers "
                                         "(parameters, bits_per_weight, rows, passes_per_token, bandwidth_gb_s, "
                                         "overhead_ms) and returns a float.", fn, *args), case)
        if close_enough(got, want, 1e-6):
            continue
        hint = next((h for value, h in _slips(*args) if close_enough(got, value, 1e-6) and
                     not close_enough(value, want, 1e-6)),
                    "tokens/s = rows / (passes_per_token x (parameters x bits_per_weight / 8 / (bandwidth_gb_s x 1e9) "
                    "+ overhead_ms / 1000)).")
        fail(COST, f"{want:.4g} tokens/s", f"{got:.4g}", f"{hint} Case: {case}")
    detail = f"Checked on {len(CASES)} made-up stages."
    if inputs:
        learner = predict_ladder(inputs, bandwidth_gb_s, overhead_ms,
                                 fn=lambda *a: _number(COST, fn(*a), "this run's ladder"))
        reference = predict_ladder(inputs, bandwidth_gb_s, overhead_ms)
        graded = [(mine, ref) for mine, ref in zip(learner, reference) if explained(ref["ratio"])]
        for mine, ref in graded:
            if not explained(mine["ratio"], TOLERANCE * (1 + 1e-6)):      # rounding never costs a right answer
                fail(COST, f"{mine['stage']!r} within {TOLERANCE:g}x of its measured {mine['measured']:.1f} "
                           f"tokens/s (the reference predicts {ref['predicted']:.1f})",
                     f"{mine['predicted']:.4g}", "the made-up stages passed, so look at the units of this run's "
                     "numbers: bandwidth in GB/s, overhead in ms, bits per weight in bits.")
        detail += (f" On this run's ladder, {len(graded)} of {len(reference)} stages predicted within "
                   f"{TOLERANCE:g}x of their measurement.")
    passed(COST, detail)
