"""The handbook chapter's claims of notebook 06 (continuous batching), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested. A verdict
that rests on timings goes through `busy.judge`: when the load probe or the spread of the
timings behind it says the machine was busy, the row says so instead of judging."""

from __future__ import annotations

from typing import Mapping

from ..busy import busy_reason, judge
from .ratios import MARGIN, compare_speed

FASTER = MARGIN        # a ratio at least this large is "faster"; within it of 1, "no measurable difference"


def alone_waste(static_run) -> tuple[float, int]:
    """(the fraction of slots idle, the number of steps) over the steps of a run in which exactly
    one sequence did useful work: the chapter's "one long response finishing alone".

    Introduced in notebook 06 (continuous batching). static_run: a `ServingResult`.
    (nan, 0) when no step had a single useful row.
    """
    alone = [r for r in static_run.steps if r.decode_rows + r.prefills == 1]
    if not alone:
        return float("nan"), 0
    return 1 - 1 / static_run.max_slots, len(alone)


def serving_claims(speed: Mapping[str, float], metrics: Mapping[str, dict], toy_static, memory: Mapping[str, float],
                   same_tokens: Mapping[str, tuple[int, int]], timings: Mapping | None = None,
                   load: float | None = None) -> list[dict]:
    """The chapter's continuous-batching claims (and the course's own) next to what notebook 06 measured.

    Introduced in notebook 06 (continuous batching).
    speed: tokens/s by server, "static", "continuous" and "hf" (section 2, side by side);
    metrics: `ServingResult.metrics()` of "static" and "continuous"; toy_static: the static
    run of the chapter's example (one long and three short answers, four slots);
    memory: `serving.reserved_vs_used` of the continuous run; same_tokens: server ->
    (requests whose tokens equal the continuous run's, requests); timings: the `Timing` (or
    its dict) of each server, and load: `busy.load_per_core()` after the run, for the busy
    guard of every verdict drawn from the clock.

    Thresholds: continuous batching "holds" when its slot use is higher than static's and
    its throughput at least FASTER (1.05) times static's; the static waste "holds" when the
    steps in which the long answer ran alone left 3/4 of the slots idle or more; the time to
    first token is "shorter" when continuous batching's p99 is at most static's / FASTER;
    ours is "no slower" than Hugging Face at a ratio of 1 / FASTER or more; the paged cache
    "holds only what is used" when its peak is below the per-slot reservation.
    """
    def busy(*names):
        return busy_reason({n: timings[n] for n in names if n in timings}, load=load) if timings else \
            busy_reason({}, load=load)

    static, continuous = metrics["static"], metrics["continuous"]
    ratio = speed["continuous"] / speed["static"]
    fuller = continuous["slot_utilization"] > static["slot_utilization"]
    verdict = ({"faster": "holds", "same": "slots refilled, but no measurable speedup here",
                "slower": "slots refilled, but slower here"}[compare_speed(ratio, FASTER)] if fuller else
               "not here: continuous batching did not keep more slots busy")
    rows = [{"claim": "continuous batching frees a finished sequence's slot between iterations",
             "measured": f"slot use {continuous['slot_utilization']:.0%} continuous vs "
                         f"{static['slot_utilization']:.0%} static; throughput {ratio:.2f}x static at "
                         f"{static['max_slots']} slots",
             "verdict": judge(verdict, busy("static", "continuous"))}]

    waste, steps = alone_waste(toy_static)
    rows.append({"claim": "static batching: one long and three short responses waste three quarters of the batch "
                          "while the long one finishes",
                 "measured": (f"{waste:.0%} of the slots idle in the {steps} steps the long answer ran alone; "
                              f"{1 - toy_static.metrics()['slot_utilization']:.0%} over the whole example; "
                              f"{1 - static['slot_utilization']:.0%} over section 2's static run") if steps else
                             "the long answer never ran alone",
                 "verdict": "holds" if steps and waste >= 0.75 - 1e-9 else "not here"})

    ttft = (static["ttft_p99"], continuous["ttft_p99"])
    shorter = ttft[1] * FASTER <= ttft[0]
    rows.append({"claim": "(course) continuous batching shortens the wait for the first token",
                 "measured": f"time to first token p99: {ttft[1]:.2f} s continuous vs {ttft[0]:.2f} s static "
                             f"(p50: {continuous['ttft_p50']:.2f} s vs {static['ttft_p50']:.2f} s)",
                 "verdict": judge("holds" if shorter else "not here", busy("static", "continuous"))})

    versus_hf = speed["continuous"] / speed["hf"]
    rows.append({"claim": "(course) our engine is no slower than Hugging Face's continuous batching",
                 "measured": f"ours / Hugging Face: {versus_hf:.2f}x",
                 "verdict": judge("holds" if versus_hf > 1 / FASTER else "not here: slower",
                                  busy("continuous", "hf"))})

    share = memory["used_bytes"] / memory["reserved_bytes"]
    rows.append({"claim": "(course) a paged cache holds only what is used",
                 "measured": f"peak {share:.0%} of a per-slot reservation for the longest request",
                 "verdict": "holds" if share < 1 else "not here"})

    differ = {name: total - same for name, (same, total) in same_tokens.items() if same != total}
    rows.append({"claim": "(course) every server gives every request the same tokens (greedy)",
                 "measured": ", ".join(f"{name}: {same}/{total}" for name, (same, total) in same_tokens.items()),
                 "verdict": "holds" if not differ else
                            "not quite: " + ", ".join(f"{n} request(s) differ for {name}" for name, n in differ.items())
                            + " (float32 rounding near a tie, from a different batch shape)"})
    return rows
