"""The handbook chapter's claims of notebook 05 (speculative decoding), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..lab.busy import busy_reason, judge
from ..lab.speculative_math import pass_costs

FASTER = 2.0          # the chapter: "sometimes 2-4 times faster"
LITTLE_GAIN = 1.1     # a speedup below this is "little benefit"
DISAGREE = 0.5        # an acceptance rate below this is a draft that "disagrees often"
EXACT = 1e-6          # total variation below this is exact (up to rounding)


def _speedup(run: Mapping, name: str) -> float:
    return run["timings"]["plain"].median / run["timings"][name].median


def _drafts(run: Mapping) -> list[str]:
    return [name for name in run["stats"] if name in run["timings"]]


def _faster_row(grounded: Mapping, load: float | None) -> dict:
    speedups = {name: _speedup(grounded, name) for name in _drafts(grounded)}
    best = max(speedups, key=speedups.get)
    x = speedups[best]
    verdict = (f"holds{' (more than 4x)' if x > 4 else ''}" if x >= FASTER else
               "partly: faster, but less than 2x" if x >= LITTLE_GAIN else "not here: no real gain")
    busy = busy_reason({n: grounded["timings"][n] for n in ("plain", best)}, load)
    return {"claim": "when draft and target agree, sometimes 2-4x faster",
            "measured": f"best on the grounded task: {best}, {x:.2f}x end to end "
                        f"(acceptance {grounded['stats'][best].acceptance_rate:.2f})",
            "verdict": judge(verdict, busy)}


def _task_row(grounded: Mapping, creative: Mapping) -> dict:
    pairs = {n: (grounded["stats"][n].acceptance_rate, creative["stats"][n].acceptance_rate)
             for n in _drafts(grounded) if n in creative["stats"]}
    lower = [n for n, (g, c) in pairs.items() if c < g]
    verdict = ("holds" if len(lower) == len(pairs) else
               f"partly: lower for {', '.join(lower)} only" if lower else "not here")
    return {"claim": "acceptance depends on the task: high on formulaic text, low on creative text",
            "measured": "; ".join(f"{n}: {g:.2f} grounded, {c:.2f} creative" for n, (g, c) in pairs.items()),
            "verdict": verdict}


def _disagree_row(creative: Mapping, load: float | None) -> dict:
    rates = {n: creative["stats"][n].acceptance_rate for n in _drafts(creative)}
    poor = [n for n, rate in rates.items() if rate < DISAGREE]
    claim = "when they disagree often, little benefit, and it may be slower than the target alone"
    if not poor:
        low = min(rates, key=rates.get)
        return {"claim": claim, "measured": f"no draft disagreed often on the creative task (lowest acceptance: "
                                            f"{low}, {rates[low]:.2f})", "verdict": "not tested here"}
    speedups = {n: _speedup(creative, n) for n in poor}
    best = max(speedups, key=speedups.get)
    busy = busy_reason({n: creative["timings"][n] for n in ("plain", *poor)}, load)
    verdict = ("holds: slower than the target alone" if speedups[best] < 1 else
               "holds: little benefit" if speedups[best] < LITTLE_GAIN else f"not here: {best} still helped")
    return {"claim": claim, "verdict": judge(verdict, busy),
            "measured": "creative task: " + "; ".join(f"{n}: acceptance {rates[n]:.2f}, {speedups[n]:.2f}x"
                                                      for n in poor)}


def _cost_row(grounded: Mapping, load: float | None) -> dict:
    costs = {n: pass_costs(grounded["stats"][n], grounded["plain_step_s"]) for n in _drafts(grounded)}
    larger = {c.larger for c in costs.values()}
    verdict = ("partly: the larger cost is the target's verify pass, not the draft" if larger == {"the verify pass"}
               else "holds: drafting costs more than the verify pass" if larger == {"the draft"}
               else "depends on the draft: " + "; ".join(f"{n}: {c.larger}" for n, c in costs.items()))
    busy = busy_reason({n: grounded["timings"][n] for n in ("plain", *costs)}, load)
    return {"claim": "the overhead is running two models (the draft's cost)",
            "measured": "per step, in plain decode steps: " + "; ".join(
                f"{n}: drafting {c.draft_per_pass:.2f}, verify pass {c.verify_per_pass:.2f}" for n, c in costs.items()),
            "verdict": judge(verdict, busy)}


def _sampling_rows(sampling: Mapping) -> list[dict]:
    tv_p, tv_q, noise = sampling["tv_target"], sampling["tv_draft"], sampling["tv_noise"]
    if tv_q <= noise:
        verdict = "inconclusive: the draft is too close to the target to tell them apart"
    else:
        verdict = "holds (within sampling noise)" if tv_p <= noise else "does not hold here"
    wrong, right = sampling["tv_resample_target"], sampling["tv_resample_residual"]
    rule = ("imprecise: the replacement comes from normalize(max(0, p - q)); from p itself it is biased"
            if right < EXACT < wrong else "holds" if wrong < EXACT else "does not hold here")
    return [{"claim": "sampled output is distributed exactly as the target's",
             "measured": f"{sampling['n']} samples: {tv_p:.3f} from p in total variation, {tv_q:.3f} from the "
                         f"draft's q; {noise:.3f} is the 99th percentile for exact samples",
             "verdict": verdict},
            {"claim": "on a rejection, the target's distribution is used to resample",
             "measured": f"computed exactly: resampling from p lands {wrong:.3f} from p, from the residual "
                         f"{right:.1e}", "verdict": rule}]


def speculative_claims(grounded: Mapping, creative: Mapping, greedy_identical: bool, sampling: Mapping | None,
                       load: float | None = None) -> list[dict]:
    """The handbook chapter's speculative-decoding claims next to what notebook 05 measured.

    Introduced in notebook 05 (speculative decoding). grounded, creative: one task each,
    {"timings": {name: measure.Timing} with "plain" among them, "stats": {draft name:
    SpeculativeStats}, "plain_step_s": seconds of one plain decode step}. greedy_identical:
    every speculative run gave plain greedy's tokens. sampling: {"n", "tv_target",
    "tv_draft", "tv_noise" (99th percentile of the distance of n exact samples),
    "tv_resample_target", "tv_resample_residual" (`speculative_token_distribution`'s
    distance from p)}, or None where sampling was not measured (the bench: notebook 05 does),
    and those two rows say so. load: `busy.load_per_core()` while measuring.

    Thresholds: "2-4x" holds from 2x, partly from 1.1x; a draft "disagrees often" below
    0.5 acceptance, and "little benefit" is below 1.1x; the costs row names the larger of
    drafting and verifying per step (`PassCosts.larger`). Timing verdicts give way to
    `busy.BUSY_VERDICT` when the run was disturbed.
    """
    return [
        _faster_row(grounded, load),
        _task_row(grounded, creative),
        _disagree_row(creative, load),
        _cost_row(grounded, load),
        {"claim": "the output is the target's own (greedy: the same tokens)",
         "measured": "same tokens as plain greedy decoding in every run" if greedy_identical
                     else "some run gave other tokens than plain greedy decoding",
         "verdict": "holds" if greedy_identical else "does not hold here"},
        *(_sampling_rows(sampling) if sampling is not None else
          [{"claim": claim, "measured": "not measured in this run (notebook 05 samples it)",
            "verdict": "not measured here"} for claim in SAMPLING_CLAIMS]),
    ]


SAMPLING_CLAIMS = ("sampled output is distributed exactly as the target's",
                   "on a rejection, the target's distribution is used to resample")


def speculative_section_claims(section: dict) -> list[dict]:
    """The speculative bench section's claims: `speculative_claims` of its grounded and creative
    ``tasks`` (timings, draft stats, ``plain_step_s``), without the sampling rows (the bench
    decodes greedily), with the suite's ``load_per_core``. Introduced in notebook 05."""
    from ..engine.speculative import SpeculativeStats
    from ..lab.measure import Timing
    names = [f.name for f in dataclasses.fields(SpeculativeStats)]

    def task(row: Mapping) -> dict:
        return {"timings": {n: Timing(list(t["samples"])) for n, t in row["timings_s"].items()},
                "stats": {n: SpeculativeStats(**{k: s[k] for k in names}) for n, s in row.get("stats", {}).items()},
                "plain_step_s": row["plain_step_s"]}
    tasks = section["tasks"]
    identical = all(same for row in tasks.values() for n, same in row.get("same_tokens_as_plain", {}).items()
                    if n in row.get("stats", {}))
    return speculative_claims(task(tasks["grounded"]), task(tasks["creative"]), identical, None,
                              load=section.get("load_per_core"))
