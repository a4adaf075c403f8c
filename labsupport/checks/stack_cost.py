"""Checker for notebook 07's exercise 4: a cost model, fitted to the ladder, that predicts every stage.

Introduced in notebook 07 (putting it together). The learner writes `cost_model(stages,
bandwidth_gb_s)`: it fits the overhead per pass (the median, over the stages, of what a pass
took beyond reading its bytes at the bandwidth; 0 if that is negative) and returns
`predict(stage)` in tokens/s; speculation's stage gives alpha and k instead of its passes per
token (`speculative_passes_per_token`, the learner's step). The checker fits it to made-up
ladders generated from a known bandwidth and overhead, where its predictions must be exact
(in one, a compute-bound stage and a stage faster than its bytes must not pull the median;
in one, the bytes alone take longer than the passes; in one, six stages each took their own
overhead, so that the median of an even count, the mean of its two middle differences, is
neither middle value nor the median of the seconds minus the median of the bytes' times). It
names each usual slip: the bytes not subtracted, GB against GiB, bits against bytes, ms against
s, rows or passes ignored, the mean, the smallest, the upper or the lower middle value, or the
difference of medians instead of the median of the differences, the target's own token
forgotten, tokens per pass instead of passes per token, alpha = 1 dividing by zero. Then it fits it to this run's
measured ladder, and grades it within `TOLERANCE` on the stages the reference explains,
speculation's stage included.
"""

from __future__ import annotations

import copy
import math
import statistics

from ..lab.stack_cost import GB, TOLERANCE, cost_model, explained, passes_per_token, speculative_passes_per_token
from .grading import Exercise, graded
from . import CheckFailed, close_enough, fail, grades_quietly, passed

COST = "the decode cost model"
PREDICTS_FROM = ("stage", "parameters", "bits_per_weight", "rows", "passes_per_token", "alpha", "k")   # all predict gets

# --- made-up ladders: every stage's passes took exactly bytes / bandwidth + overhead ------------------


def _stage(name, parameters, bits, rows, passes=None, alpha=None, k=None, *, bandwidth, overhead_ms, slower=1.0):
    """A made-up stage whose passes took `slower` x (its bytes at `bandwidth` GB/s + `overhead_ms`)."""
    seconds = slower * (parameters * bits / 8 / (bandwidth * GB) + overhead_ms / 1e3)
    p = passes if passes is not None else speculative_passes_per_token(alpha, k)
    return {"stage": name, "parameters": parameters, "bits_per_weight": bits, "rows": rows,
            "passes_per_token": passes, "alpha": alpha, "k": k,
            "seconds_per_pass": seconds, "measured": rows / (p * seconds)}


def _cpu(bandwidth=20.0, overhead_ms=6.0, **more):
    """A CPU-like ladder of the 135M model: fp32, bf16 and int4 (about 5 bits), batch 1 and 4."""
    s = lambda *a, **k: _stage(*a, bandwidth=bandwidth, overhead_ms=overhead_ms, **k)      # noqa: E731
    return [s("fp32, batch 1", 135e6, 32, 1, 1.02), s("fp32, batch 4", 135e6, 32, 4, 1.25),
            s("bf16, batch 4", 135e6, 16, 4, 1.25), s("int4, batch 4", 135e6, 5.0, 4, 1.25),
            s("int4, batch 1", 135e6, 5.0, 1, 1.02)]


def _scenarios() -> list[dict]:
    """name, bandwidth, the stages to fit, the stages to grade (with their expected tokens/s)."""
    held_out = _stage("int8, batch 8 (never measured)", 135e6, 8.5, 8, 1.1, bandwidth=20.0, overhead_ms=6.0)
    gpu = lambda *a, **k: _stage(*a, bandwidth=3000.0, overhead_ms=0.08, **k)               # noqa: E731
    gpu_ladder = [gpu("bf16, batch 16", 1.7e9, 16, 16, 1.1), gpu("int4, batch 16", 1.7e9, 5.0, 16, 1.1),
                  gpu("bf16, batch 1", 1.7e9, 16, 1, 1.0), gpu("speculation, int4", 1.7e9, 5.0, 1, alpha=0.7, k=4),
                  gpu("speculation, bf16", 1.7e9, 16, 1, alpha=0.9, k=2)]
    extremes = [gpu("bf16, batch 1", 1.7e9, 16, 1, 1.0), gpu("every draft kept", 1.7e9, 5.0, 1, alpha=1.0, k=3),
                gpu("no draft kept", 1.7e9, 5.0, 1, alpha=0.0, k=4), gpu("int4, batch 1", 1.7e9, 5.0, 1, 1.0)]
    outliers = [_stage("fp32, batch 32 (compute-bound)", 135e6, 32, 32, 1.1, bandwidth=20.0, overhead_ms=6.0,
                       slower=3.0),
                _stage("int4, batch 1 (its weights in a cache)", 135e6, 5.0, 1, 1.02, bandwidth=20.0,
                       overhead_ms=6.0, slower=0.5)]
    # passes timed at 20 GB/s + 1 ms, the bandwidth given as 5 GB/s: the bytes alone take longer
    low = _cpu(overhead_ms=1.0)
    # six passes beyond their bytes by 2 to 15 ms: an even count, whose median (6.5 ms) is the mean of the middle
    # two (5 and 8), and not the median of the seconds minus the median of the bytes' times (8.5 ms)
    shapes = [("fp32, batch 1", 32, 1, 1.02), ("fp32, batch 4", 32, 4, 1.25), ("bf16, batch 4", 16, 4, 1.25),
              ("int4, batch 4", 5.0, 4, 1.25), ("int4, batch 1", 5.0, 1, 1.02), ("int8, batch 8", 8.5, 8, 1.1)]
    uneven = [_stage(name, 135e6, bits, rows, passes, bandwidth=20.0, overhead_ms=ms)
              for (name, bits, rows, passes), ms in zip(shapes, (2, 3, 5, 8, 9, 15))]
    return [
        {"name": "a CPU ladder, 20 GB/s, 6 ms per pass", "bandwidth": 20.0, "fit": _cpu(),
         "graded": _cpu() + [held_out]},
        {"name": "a GPU ladder with speculation, 3000 GB/s, 0.08 ms per pass", "bandwidth": 3000.0,
         "fit": gpu_ladder, "graded": gpu_ladder},
        {"name": "speculation at alpha = 1 and alpha = 0", "bandwidth": 3000.0, "fit": extremes,
         "graded": extremes},
        {"name": "the CPU ladder, one compute-bound stage (3x bytes + overhead) and one faster than its bytes "
                 "(half)", "bandwidth": 20.0, "fit": _cpu() + outliers, "graded": _cpu() + [held_out]},
        {"name": "a bandwidth measured low (5 GB/s): the bytes alone take longer than the passes",
         "bandwidth": 5.0, "fit": low, "graded": low},
        {"name": "six CPU stages whose passes took 2 to 15 ms beyond their bytes, 20 GB/s", "bandwidth": 20.0,
         "fit": uneven, "graded": uneven + [held_out]},
    ]


# --- the usual slips, each a whole model (the fit and the prediction with one thing wrong) ------------


def _slip_model(stages, bandwidth, *, unit=GB, weight_bytes=lambda s: s["parameters"] * s["bits_per_weight"] / 8,
                subtract=True, fit=statistics.median, clamp=True, add_overhead=1.0, rows=True, passes="divide",
                speculation=speculative_passes_per_token, invert=False, split=False):
    """`cost_model` with one slip (a keyword away from its default); returns predict(stage).
    split: the median of the seconds minus the median of the bytes' times, not the median of the differences."""
    reading = lambda s: weight_bytes(s) / (bandwidth * unit)                  # noqa: E731
    overhead = fit([s["seconds_per_pass"] - (reading(s) if subtract else 0.0) for s in stages])
    if split:
        overhead = fit([s["seconds_per_pass"] for s in stages]) - fit([reading(s) for s in stages])
    overhead = max(0.0, overhead) if clamp else overhead

    def predict(s):
        p = s["passes_per_token"] if s["passes_per_token"] is not None else speculation(s["alpha"], s["k"])
        p = {"divide": p, "ignore": 1.0, "multiply": 1 / p}[passes]
        value = (s["rows"] if rows else 1) / (p * (reading(s) + add_overhead * overhead))
        return 1 / value if invert else value
    return predict


def _tokens(alpha, k):          # tokens per pass, alpha = 1 included (sum(alpha ** i for i in range(k + 1)))
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


SPECULATION = "speculation's passes per token: "
SLIPS = [
    (dict(subtract=False), "the overhead is what a pass took beyond reading its bytes: subtract the bytes' time "
                           "(bytes / bandwidth) from seconds_per_pass before taking the median."),
    (dict(add_overhead=0.0), "a pass costs its bytes' time plus the fitted overhead: add the overhead to every pass."),
    (dict(add_overhead=1e3), "seconds_per_pass is in seconds: keep the overhead in seconds (milliseconds added to "
                             "the bytes' seconds count 1000 times too much)."),
    (dict(add_overhead=1e-3), "seconds_per_pass is already in seconds: do not divide the overhead by 1000."),
    (dict(unit=2**30), "a GB is 10**9 bytes (a GiB, 2**30, is 7% more): bandwidth_gb_s x 1e9 bytes per second."),
    (dict(unit=1.0), "bandwidth_gb_s is in GB/s: multiply it by 1e9 for bytes per second."),
    (dict(weight_bytes=lambda s: s["parameters"] * s["bits_per_weight"]),
     "bits_per_weight is in bits: divide by 8 for bytes."),
    (dict(weight_bytes=lambda s: s["parameters"] * 4),
     "read each stage's weights in its own precision: bytes = parameters x bits_per_weight / 8, not 4 bytes "
     "(fp32) each."),
    (dict(rows=False), "one pass serves every row of the batch: multiply by rows."),
    (dict(passes="ignore"), "each sequence takes passes_per_token passes per token it keeps (prefill and padding "
                            "add some): divide by it."),
    (dict(passes="multiply"), "passes_per_token is passes per token: divide by it, do not multiply."),
    (dict(invert=True), "return tokens per second, not seconds per token."),
    (dict(fit=statistics.fmean), "the fit is the median, not the mean: one compute-bound stage pulls a mean, "
                                 "and every other prediction with it."),
    (dict(fit=min), "the fit is the median, not the smallest: one stage that ran faster than the model (its "
                    "weights in a cache) pulls the smallest down, and every other prediction with it."),
    (dict(fit=statistics.median_high), "the median of an even number of stages is the mean of the two middle ones "
                                       "(statistics.median), not the upper one."),
    (dict(fit=statistics.median_low), "the median of an even number of stages is the mean of the two middle ones "
                                      "(statistics.median), not the lower one."),
    (dict(split=True), "the overhead is the median of the differences (each pass's seconds minus its own bytes' "
                       "time), not the median of the seconds minus the median of the bytes' times."),
    (dict(clamp=False), "a median below zero means the bytes alone took longer than the passes (the bandwidth "
                        "measured low): the overhead is then 0, never negative."),
    (dict(speculation=lambda a, k: _tokens(a, k)),
     SPECULATION + "a pass keeps 1 + alpha + ... + alpha^k tokens; passes per token is the inverse of that, "
                   "not the tokens per pass themselves."),
    (dict(speculation=lambda a, k: (1 - a) / (1 - a ** k)),
     SPECULATION + "count the target's own token: a pass keeps up to k + 1 tokens, 1 + alpha + ... + alpha^k, "
                   "which is (1 - alpha^(k+1)) / (1 - alpha), not (1 - alpha^k) / (1 - alpha)."),
    (dict(speculation=lambda a, k: 1 - a),
     SPECULATION + "a pass checks only k drafts: the sum 1 + alpha + alpha^2 + ... stops at alpha^k; 1 / (1 - alpha) "
                   "is its limit for endless drafts."),
    (dict(speculation=lambda a, k: 1 / (1 + k * a)),
     SPECULATION + "draft i counts only if drafts 1..i all pass, with chance alpha^i: 1 + alpha + alpha^2 + ... + "
                   "alpha^k tokens per pass, not 1 + k x alpha."),
    (dict(speculation=lambda a, k: 1 / (k + 1)),
     SPECULATION + "not every draft is kept: alpha is the chance of each; k + 1 tokens per pass only at alpha = 1."),
    (dict(speculation=lambda a, k: 1.0),
     SPECULATION + "a verifying pass keeps several tokens, so fewer than 1 pass per token: derive it from "
                   "alpha and k."),
]

SPECULATION_HINT = (SPECULATION + "the plain stages are right, so look at speculation: a pass keeps the target's own "
                    "token and draft i if drafts 1..i all pass (notebook 05's exercise 2, the same alpha for all); "
                    "passes per token is the inverse of the tokens a pass keeps.")
RULE_HINT = ("a pass costs its weights' bytes at the bandwidth plus the overhead (the median of what each pass took "
             "beyond its bytes); a stage makes rows tokens per passes_per_token such passes.")


def _slip_values(scenario, slip) -> list[float | None]:
    try:
        predict = _slip_model(copy.deepcopy(scenario["fit"]), scenario["bandwidth"], **slip)
    except (ArithmeticError, ValueError):
        return [None] * len(scenario["graded"])
    out = []
    for s in scenario["graded"]:
        try:
            out.append(predict(s))
        except ArithmeticError:
            out.append(None)
    return out


def _hint(scenario, got: list[float], want: list[float]) -> str:
    """The slip whose predictions are all of `got` (and differ from `want`), else a rule."""
    for slip, hint in SLIPS:
        values = _slip_values(scenario, slip)
        if all(v is not None and close_enough(g, v, 1e-6) for g, v in zip(got, values)) and \
                not all(close_enough(v, w, 1e-6) for v, w in zip(values, want)):
            return hint
    wrong = [s for s, g, w in zip(scenario["graded"], got, want) if not close_enough(g, w, 1e-6)]
    if all(s["passes_per_token"] is None for s in wrong):
        return SPECULATION_HINT
    return RULE_HINT


# --- calling the learner's code -------------------------------------------------------------------------


def _raised(error: Exception, stage: dict | None, where: str) -> str:
    """The hint for an error the learner's code raised on `stage` (None: in the fit)."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, ZeroDivisionError) and stage is not None and stage.get("alpha") == 1:
        return (f"{text}. At alpha = 1 every draft is kept and 1 - alpha is 0: a pass then keeps k + 1 tokens; "
                "sum the powers of alpha, or treat alpha = 1 on its own.")
    if isinstance(error, TypeError) and "NoneType" in str(error):
        return (f"{text}. The speculative stage has passes_per_token None: derive its passes per token from its "
                "alpha and k, and fit from seconds_per_pass, which every stage has.")
    if isinstance(error, KeyError) and stage is not None:
        return (f"{text}. predict(stage) gets only {', '.join(PREDICTS_FROM)}: it predicts a stage from its weights, "
                "rows and passes, also one never measured (use the fitted overhead, not the stage's own timing).")
    return f"{text}, {where}."


def _number(value, stage: dict, case: str) -> float:
    """`value` as a float, or CheckFailed saying that a finite number of tokens/s was expected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        fail(COST, f"tokens/s for {stage['stage']!r}", repr(value)[:60],
             f"predict(stage) returns a float. Case: {case}")
    value = float(value)
    if not math.isfinite(value):
        hint = ("at alpha = 1 every draft is kept and 1 - alpha is 0: a pass then keeps k + 1 tokens."
                if stage.get("alpha") == 1 else "look for a division by zero.")
        fail(COST, f"a finite number of tokens/s for {stage['stage']!r}", value, f"{hint} Case: {case}")
    return value


def _predict(fn, stages: list[dict], bandwidth: float, graded: list[dict], case: str) -> list[float]:
    """Fit the learner's model to copies of `stages`, then predict each of `graded`, given only the
    keys of PREDICTS_FROM (a stage never measured has no timing)."""
    try:
        predict = fn(copy.deepcopy(stages), bandwidth)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:                               # noqa: BLE001 - the learner's code failed
        fail(COST, "a function predict(stage)", "an error", _raised(error, None, f"in cost_model. Case: {case}"))
    if not callable(predict):
        fail(COST, "a function predict(stage) that returns tokens/s", repr(predict)[:60],
             "cost_model fits the overhead, then returns a function of one stage (define predict inside it, "
             "and return predict, not predict(...)).")
    out = []
    for s in graded:
        stage = {key: s[key] for key in PREDICTS_FROM}
        try:
            value = predict(stage)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as error:                           # noqa: BLE001
            fail(COST, f"tokens/s for {s['stage']!r}", "an error",
                 _raised(error, s, f"predicting {s['stage']!r}. Case: {case}"))
        out.append(_number(value, s, case))
    return out


def _describe(stage: dict) -> str:
    passes = (f"{stage['passes_per_token']} passes per token" if stage["passes_per_token"] is not None
              else f"speculation, alpha {stage['alpha']}, k {stage['k']}")
    return (f"{stage['stage']!r}: {stage['parameters']:.3g} parameters, {stage['bits_per_weight']:g} bits, "
            f"{stage['rows']} rows, {passes}")


@grades_quietly
@graded(Exercise(title=COST, teaches="a cost model of decoding: the overhead per pass fitted as a median beyond the "
                                    "weights' bytes, and each stage's tokens/s predicted from it"))
def check_decode_cost_model(fn, inputs: list[dict] | None = None, bandwidth_gb_s: float | None = None) -> None:
    """Check `fn(stages, bandwidth_gb_s) -> predict`, predict(stage) -> tokens/s (`stack_cost.cost_model`).

    Introduced in notebook 07 (putting it together). First on made-up ladders generated from a
    known bandwidth and overhead, exactly (to 1e-6), a stage never measured included, with a hint
    for each usual slip; then, given this run's `stack_cost.cost_inputs` and bandwidth, against
    the measured ladder: within TOLERANCE (2x) on every stage where the reference is (the model
    is simple: the stages it misses are reported, not graded).
    """
    scenarios = _scenarios()
    for scenario in scenarios:
        case = scenario["name"]
        reference = cost_model(copy.deepcopy(scenario["fit"]), scenario["bandwidth"])
        want = [reference(s) for s in scenario["graded"]]
        got = _predict(fn, scenario["fit"], scenario["bandwidth"], scenario["graded"], case)
        for s, g, w in zip(scenario["graded"], got, want):
            if not close_enough(g, w, 1e-6):
                fail(COST, f"{w:.6g} tokens/s for {_describe(s)}", f"{g:.6g}",
                     f"{_hint(scenario, got, want)} Case: {case}.")
    detail = (f"Exact on {len(scenarios)} made-up ladders, speculation at alpha = 0, 0.7, 0.9 and 1 included, "
              "and not pulled by the odd stage, slower or faster.")
    if inputs:
        reference = cost_model(copy.deepcopy(inputs), bandwidth_gb_s)
        mine = _predict(fn, inputs, bandwidth_gb_s, inputs, "this run's ladder")
        graded = 0
        for s, got in zip(inputs, mine):
            ref = reference(s)
            if not explained(ref / s["measured"]):
                continue
            graded += 1
            if not explained(got / s["measured"], TOLERANCE * (1 + 1e-6)):      # rounding never costs a right answer
                fail(COST, f"{s['stage']!r} within {TOLERANCE:g}x of its measured {s['measured']:.1f} tokens/s "
                           f"(the reference predicts {ref:.1f})", f"{got:.4g}",
                     "the made-up ladders passed, so look at what differs in this run's: stage names, how many "
                     "stages there are, their units (GB/s, seconds, bits), the speculative stage.")
        detail += (f" On this run's ladder, {graded} of {len(inputs)} stages predicted within {TOLERANCE:g}x of their "
                   f"measurement, where the reference is too")
        spec = next((s for s in inputs if s["passes_per_token"] is None), None)
        if spec is not None:
            detail += (f"; speculation (alpha {spec['alpha']:.2f}, k {spec['k']}) at "
                       f"{passes_per_token(spec):.2f} passes per token")
        detail += "."
    passed(COST, detail)
