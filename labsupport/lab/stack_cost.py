"""A cost model of the ladder: each pass reads its weights at the copy bandwidth, plus an overhead.

Introduced in notebook 07 (putting it together), its exercise 4.

The simplest model of a decode step that notebook 00's roofline allows: one forward
pass reads every weight once (bytes = parameters x bits per weight / 8) at the
bandwidth measured by copying, and costs a fixed overhead on top (Python, kernel
launches, attention, everything that is not reading weights). A pass serves
``rows`` sequences at once (batching), and each sequence takes ``passes_per_token``
passes per token it keeps (1 for plain decoding, a little more with prefill and
padding), so

    seconds per pass = parameters x bits / 8 / bandwidth + overhead
    tokens/s         = rows / (passes_per_token x seconds per pass)

With speculation a pass keeps 1 + alpha + ... + alpha^k tokens on average (k drafts,
each accepted with probability alpha if all before it were: notebook 05), so its
passes per token are the inverse (`speculative_passes_per_token`).

`cost_inputs` reads those quantities off `stack.run_stack`'s rows (its weight bytes,
counted forward passes and, for speculation, its acceptance rate), `fit_overhead` takes
the overhead as the median, over the stages, of what a pass took beyond its bytes (0 if
that median is negative), and `cost_model` (the reference of the exercise) fits it and
returns the predictor. Where the prediction misses the measurement by more than
`TOLERANCE`, something the model leaves out set the pace (compute at a large batch, a
kernel's unpacking, the scheduler's own work): `cost_misses` names those stages.
"""

from __future__ import annotations

import statistics

from ..errors import LabError
from .speculative_math import expected_tokens_per_call

GB = 1e9                 # bandwidth is given in GB/s: 10**9 bytes, not 2**30 (a GiB)
TOLERANCE = 2.0          # a stage the model explains is predicted within this factor of its measurement


def predict_tokens_per_s(parameters: float, bits_per_weight: float, rows: int, passes_per_token: float,
                         bandwidth_gb_s: float, overhead_ms: float) -> float:
    """Decode tokens/s of the cost model: rows / (passes_per_token x (bytes / bandwidth + overhead)).

    Introduced in notebook 07 (putting it together), a step of its exercise 4's reference.
    bits_per_weight: 32 for fp32, 16 for bf16, about 5 for int4 in groups of 32 (a 16-bit
    scale and minimum per group); bandwidth in GB/s (10**9 bytes/s); overhead in milliseconds.
    """
    seconds_per_pass = parameters * bits_per_weight / 8 / (bandwidth_gb_s * GB) + overhead_ms / 1e3
    return rows / (passes_per_token * seconds_per_pass)


def speculative_passes_per_token(alpha: float, k: int) -> float:
    """Target passes per kept token when each of k drafts is accepted with probability alpha (if
    all before it were): 1 / (1 + alpha + ... + alpha^k), 1 / (k + 1) at alpha = 1.
    Introduced in notebook 07 (putting it together), a step of its exercise 4's reference;
    the tokens per pass are notebook 05's `speculative_math.expected_tokens_per_call`."""
    return 1 / expected_tokens_per_call(alpha, k)


def passes_per_token(stage: dict) -> float:
    """A stage's passes per token: its own, or for speculation (passes_per_token None) derived
    from its alpha and k. Introduced in notebook 07 (putting it together)."""
    if stage.get("passes_per_token") is not None:
        return stage["passes_per_token"]
    return speculative_passes_per_token(stage["alpha"], stage["k"])


def cost_inputs(result: dict) -> list[dict]:
    """The cost model's inputs for every stage of `run_stack`'s result that decodes with the
    KV cache (the naive loop re-reads the whole sequence each pass, the peers are not counted).

    Introduced in notebook 07 (putting it together). One dict per stage: stage, parameters
    (the fp32 model's weight bytes / 4), bits_per_weight (its weight bytes x 8 / parameters),
    rows (sequences sharing each pass), passes_per_token (passes x rows / generated tokens:
    per sequence, prefill and padding included), measured (tokens/s), seconds_per_pass,
    alpha and k (None but for speculation), counted_passes_per_token (what run_stack counted).
    The speculative stage, when its row says what its drafts did (``speculation``), has
    passes_per_token None: the model derives it from its acceptance rate alpha and its k.
    """
    rows = {r["stage"]: r for r in result["stages"]}
    if "+ KV cache" not in rows or rows["+ KV cache"].get("weight_bytes") is None:
        raise LabError("cost_inputs needs run_stack's result with its '+ KV cache' stage (the fp32 model).")
    parameters = rows["+ KV cache"]["weight_bytes"] / 4
    out = []
    for row in result["stages"]:
        if row["stage"] == "naive loop" or not row.get("weight_passes") or row.get("batch_rows") is None:
            continue
        counted = row["weight_passes"] * row["batch_rows"] / result["tokens"]
        speculation = row.get("speculation")
        out.append({"stage": row["stage"], "parameters": parameters,
                    "bits_per_weight": row["weight_bytes"] * 8 / parameters, "rows": row["batch_rows"],
                    "passes_per_token": None if speculation else counted,
                    "alpha": speculation["alpha"] if speculation else None,
                    "k": speculation["k"] if speculation else None,
                    "measured": row["tokens_per_s"], "seconds_per_pass": row["seconds"] / row["weight_passes"],
                    "counted_passes_per_token": counted})
    return out


def fit_overhead(inputs: list[dict], bandwidth_gb_s: float) -> float:
    """The per-pass overhead in milliseconds: the median, over the stages, of what one pass took
    beyond reading its weights at the bandwidth (0 if the bytes alone take longer).
    Introduced in notebook 07 (putting it together)."""
    if not inputs:
        raise LabError("fit_overhead needs at least one stage (cost_inputs of run_stack's result).")
    beyond = [s["seconds_per_pass"] - s["parameters"] * s["bits_per_weight"] / 8 / (bandwidth_gb_s * GB)
              for s in inputs]
    return max(0.0, statistics.median(beyond)) * 1e3


def cost_model(stages: list[dict], bandwidth_gb_s: float):
    """The cost model fitted to `stages` (`cost_inputs`): a function of one stage (parameters,
    bits_per_weight, rows, and passes_per_token, or alpha and k) that returns its tokens/s.

    Introduced in notebook 07 (putting it together), the reference of its exercise 4: the
    overhead per pass is `fit_overhead`'s median, speculation's passes per token come from
    `speculative_passes_per_token`, and `predict_tokens_per_s` puts them together.
    """
    overhead_ms = fit_overhead(stages, bandwidth_gb_s)

    def predict(stage: dict) -> float:
        return predict_tokens_per_s(stage["parameters"], stage["bits_per_weight"], stage["rows"],
                                    passes_per_token(stage), bandwidth_gb_s, overhead_ms)
    predict.overhead_ms = overhead_ms
    return predict


def predict_ladder(inputs: list[dict], bandwidth_gb_s: float, predict=None) -> list[dict]:
    """Each stage's predicted tokens/s (by `predict`, a function of one stage; default the
    reference `cost_model` fitted to `inputs`) beside its measurement, their ratio (predicted /
    measured), and the passes per token it used. Introduced in notebook 07 (putting it together)."""
    predict = predict or cost_model(inputs, bandwidth_gb_s)
    out = []
    for s in inputs:
        predicted = predict(dict(s))
        out.append({"stage": s["stage"], "predicted": predicted, "measured": s["measured"],
                    "ratio": predicted / s["measured"], "passes_per_token": passes_per_token(s)})
    return out


def explained(ratio: float, tolerance: float = TOLERANCE) -> bool:
    """True when a prediction is within `tolerance` (a factor) of its measurement, either way.
    Introduced in notebook 07 (putting it together)."""
    return 1 / tolerance <= ratio <= tolerance


def cost_misses(predictions: list[dict], tolerance: float = TOLERANCE) -> list[str]:
    """One sentence per stage the cost model misses by more than `tolerance`: over-predicted means
    a pass took longer than bytes + overhead (compute, a kernel's unpacking, scheduling), under-
    predicted means it took less than the median overhead. Introduced in notebook 07."""
    lines = []
    for p in predictions:
        if explained(p["ratio"], tolerance):
            continue
        if p["ratio"] > 1:
            why = ("Its passes took longer than their bytes and the median overhead. Something the model leaves "
                   "out set its pace: arithmetic at this batch, a kernel's own work, or the scheduler.")
        else:
            why = "Its passes took less than the median overhead: that overhead does not fit every stage."
        lines.append(f"{p['stage']}: predicted {p['predicted']:.1f} tokens/s, measured {p['measured']:.1f} "
                     f"({p['ratio']:.2f}x). {why}")
    return lines
