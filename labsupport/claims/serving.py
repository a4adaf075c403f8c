"""The handbook chapter's claims of notebooks 06 (continuous batching) and 06b (chunked prefill and prefix
caching), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested. A verdict
that rests on timings goes through `busy.judge`: when the load probe or the spread of the
timings behind it says the machine was busy, the row says so instead of judging."""

from __future__ import annotations

from typing import Mapping

from ..lab.busy import busy_reason, judge
from .ratios import MARGIN, compare_speed
from ..lab.serving_metrics import summarize

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
    metrics: `summarize(ServingResult)` of "static" and "continuous"; toy_static: the static
    run of the chapter's example (one long and three short answers, four slots), or None
    where it was not run (the bench), and its row says so;
    memory: `serving_metrics.reserved_vs_used` of the continuous run; same_tokens: server ->
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

    claim = "static batching: one long and three short responses waste three quarters of the batch while the " \
            "long one finishes"
    if toy_static is None:
        rows.append({"claim": claim, "measured": f"the chapter's example not run here (notebook 06 runs it); "
                                                 f"{1 - static['slot_utilization']:.0%} of the slots idle over the "
                                                 "static run", "verdict": "not measured here"})
    else:
        waste, steps = alone_waste(toy_static)
        rows.append({"claim": claim,
                     "measured": (f"{waste:.0%} of the slots idle in the {steps} steps the long answer ran alone; "
                                  f"{1 - summarize(toy_static)['slot_utilization']:.0%} over the whole example; "
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


# --- the production engine's claims: the prefill stall, chunked prefill, prefix caching, the load curve ---

LATENCY_GAIN = 1.5          # the targets: a latency figure "improves" at 1.5x or more ...
THROUGHPUT_KEPT = 0.9       # ... at a throughput within 10% of without
PREFILL_SHARE = 0.5         # prefix caching computes at most half the prompt tokens


def prefill_stall(run) -> dict:
    """How much longer the steps that prefilled a newcomer lasted than the steps that only decoded.

    Introduced in notebook 06b (chunked prefill and prefix caching). run: a `ServingResult` without a token
    budget (each newcomer prefilled whole, before the decode batch). Returns {"prefill_step_s",
    "decode_step_s" (medians), "prefill_steps", "decode_steps", "ratio"}; nan where a kind of
    step is missing.
    """
    import numpy as np
    with_prefill = [r.end - r.start for r in run.steps if r.prefill_tokens and r.decode_rows]
    decode_only = [r.end - r.start for r in run.steps if not r.prefill_tokens and r.decode_rows]
    nan = float("nan")
    prefill_s = float(np.median(with_prefill)) if with_prefill else nan
    decode_s = float(np.median(decode_only)) if decode_only else nan
    return {"prefill_step_s": prefill_s, "decode_step_s": decode_s, "prefill_steps": len(with_prefill),
            "decode_steps": len(decode_only), "ratio": prefill_s / decode_s if decode_only else nan}


def engine_claims(stall: Mapping[str, float], prefix: Mapping[str, dict], chunked: Mapping[str, dict],
                  curve: list[dict], busy: Mapping[str, str | None] | None = None) -> list[dict]:
    """The claims of notebook 06b (chunked prefill, prefix caching, the load curve), with verdicts.

    Introduced in notebook 06b (chunked prefill and prefix caching).
    stall: `prefill_stall` of a continuous run without a token budget; prefix: `metrics()` of
    "without" and "with" prefix caching on the chat workload; chunked: load-curve rows (or
    metrics with "itl_p99" and "throughput") "without" and "with" chunked prefill at a rate near
    saturation; curve: `load_curve` rows of the "continuous" configuration (at least two rates);
    busy: why the machine looked busy while each of "stall", "prefix", "chunked", "curve" was
    measured (`busy.busy_reason`), or None; a busy group gets no verdict.

    Thresholds: the stall "holds" when steps with a prefill last at least FASTER (1.05) times
    the decode-only ones; chunked prefill "holds" when p99 inter-token latency improves
    LATENCY_GAIN (1.5) times or more with throughput at least THROUGHPUT_KEPT (0.9) of without;
    prefix caching "holds" when it computes at most PREFILL_SHARE (half) of the prompt tokens
    and the time to first token p50 improves LATENCY_GAIN times; the load curve "holds" when,
    from the lowest to the highest rate, the time to first token p99 at least doubles while
    throughput grows by less than the rate does.
    """
    busy = busy or {}
    rows = []
    ratio = stall["ratio"]
    rows.append({"claim": "(course) prefilling a newcomer alone stalls every running request for that step",
                 "measured": f"steps with a prefill {stall['prefill_step_s'] * 1e3:.0f} ms vs "
                             f"{stall['decode_step_s'] * 1e3:.0f} ms decoding only (median, {stall['prefill_steps']} "
                             f"and {stall['decode_steps']} steps): {ratio:.2f}x",
                 "verdict": judge("holds" if ratio >= FASTER else "not here: no longer than a decode step",
                                  busy.get("stall"))})

    without, with_ = chunked["without"], chunked["with"]
    gain, kept = without["itl_p99"] / with_["itl_p99"], with_["throughput"] / without["throughput"]
    verdict = ("holds" if gain >= LATENCY_GAIN and kept >= THROUGHPUT_KEPT else
               f"shorter tail, but throughput {kept:.0%} of without" if gain >= LATENCY_GAIN else
               f"not here: the p99 inter-token latency improved {gain:.2f}x")
    rows.append({"claim": "chunked prefill bounds inter-token latency at little cost in throughput (Sarathi)",
                 "measured": f"p99 inter-token latency {without['itl_p99'] * 1e3:.0f} ms without, "
                             f"{with_['itl_p99'] * 1e3:.0f} ms with ({gain:.2f}x); throughput {kept:.0%} of without",
                 "verdict": judge(verdict, busy.get("chunked"))})

    plain, cached = prefix["without"], prefix["with"]
    share = cached["prefill_tokens_computed"] / plain["prefill_tokens_computed"]
    faster = plain["ttft_p50"] / cached["ttft_p50"]
    verdict = ("holds" if share <= PREFILL_SHARE and faster >= LATENCY_GAIN else
               f"fewer tokens computed, but the first token only {faster:.2f}x sooner" if share <= PREFILL_SHARE else
               f"not here: {share:.0%} of the prompt tokens still computed")
    rows.append({"claim": "prefix caching computes a shared prompt prefix once",
                 "measured": f"{cached['prefill_tokens_computed']} of {plain['prefill_tokens_computed']} prompt tokens "
                             f"computed ({share:.0%}); time to first token p50 {faster:.2f}x shorter",
                 "verdict": judge(verdict, busy.get("prefix") if share <= PREFILL_SHARE else None)})

    points = sorted(curve, key=lambda r: r["rate"])
    low, high = points[0], points[-1]
    grew = high["throughput"] / low["throughput"]
    waits = high["ttft_p99"] / low["ttft_p99"]
    bends = waits >= 2 and grew < high["rate"] / low["rate"]
    rows.append({"claim": "(course) past saturation, waiting grows while throughput stops growing",
                 "measured": f"from {low['rate']:.2f} to {high['rate']:.2f} requests/s: throughput {grew:.2f}x, "
                             f"time to first token p99 {waits:.2f}x",
                 "verdict": judge("holds" if bends else "not here: no knee in this range of rates", busy.get("curve"))})
    return rows


def serving_section_claims(section: dict) -> list[dict]:
    """The serving bench section's claims: `serving_claims` (without the chapter's toy example,
    which the bench does not run) and `engine_claims` of the section's dict (its speeds,
    metrics, memory, same tokens, ``prefill_stall`` of the continuous run, and the
    ``load_curve`` near saturation), each verdict guarded by the loads it recorded.

    Introduced in notebook 06 (continuous batching)."""
    timings, load = section["timings_s"], section.get("load")
    curve = section["load_curve"]
    near = {r["configuration"]: r for r in curve["rows"] if r["rate"] == curve["chunked_at"]}

    def busy(*names):
        return busy_reason({n: timings[n] for n in names if n in timings}, load=load)
    curve_busy = busy_reason({}, load=curve.get("load"))
    rows = serving_claims(section["tokens_per_s"], section["metrics"], None, section["memory"],
                          {name: tuple(v) for name, v in section["same_tokens"].items()}, timings=timings, load=load)
    rows += engine_claims(section["prefill_stall"],
                          {"without": section["metrics"]["continuous"], "with": section["metrics"]["prefix caching"]},
                          {"without": near["continuous"], "with": near["chunked prefill"]},
                          [r for r in curve["rows"] if r["configuration"] == "continuous"],
                          busy={"stall": busy("continuous"), "prefix": busy("continuous", "prefix caching"),
                                "chunked": curve_busy, "curve": curve_busy})
    return rows


def batching_losses(speed: Mapping[str, float], metrics: Mapping[str, dict], costs: Mapping[str, float] | None = None,
                    busy: Mapping[str, str | None] | None = None) -> list[str]:
    """Where continuous batching and the paged cache did not pay on this machine, one sentence
    each (none when nothing lost). Introduced in notebook 06 (continuous batching): its "where
    it loses here" ledger.

    speed, metrics: as for `serving_claims` ("static", "continuous", "hf"); costs:
    `decode_cost.decode_step_costs` (None: not run); busy: the busy reason of "speed" and
    "costs", carried by the lines timed then. Thresholds are `serving_claims`' (FASTER); a
    decode step's gather "costs" from a tenth of the step."""
    note = _busy_note(busy)
    lines = []
    static, continuous = metrics["static"], metrics["continuous"]
    ratio = speed["continuous"] / speed["static"]
    if compare_speed(ratio, FASTER) != "faster":
        lines.append(f"Continuous batching ran at {ratio:.2f}x static batching's throughput. It kept "
                     f"{continuous['slot_utilization']:.0%} of the slots busy against {static['slot_utilization']:.0%}, "
                     f"in {continuous['steps']} steps against {static['steps']}. Fuller steps help only as much as one "
                     "step of many rows is cheaper than several steps of few (notebook 02). This device decides how "
                     f"much cheaper.{note('speed')}")
    versus_hf = speed["continuous"] / speed["hf"]
    if versus_hf < 1 / FASTER:
        lines.append(f"Our continuous engine ran at {versus_hf:.2f}x Hugging Face's manager. By default, "
                     "transformers prefills in chunks and shares prefixes. Our paged step copies every row's context "
                     f"out of the pool in every layer.{note('speed')}")
    if costs is not None and costs["gather_share"] + costs["table_build_share"] >= 0.1:
        lines.append(f"The paged decode step spent {costs['gather_share']:.0%} of its time gathering each row's "
                     f"context out of the pool, and {costs['table_build_share']:.0%} building block tables. No kernel "
                     "here reads the block table in place, as vLLM's PagedAttention does. So paging costs a copy per "
                     f"layer and step.{note('costs')}")
    return lines


def engine_losses(stall: Mapping[str, float], prefix: Mapping[str, dict], chunked: Mapping[str, dict],
                  sources: Mapping[str, int] | None = None, busy: Mapping[str, str | None] | None = None) -> list[str]:
    """Where chunked prefill and prefix caching did not pay on this machine, one sentence each
    (none when nothing lost). Introduced in notebook 06b (chunked prefill and prefix caching):
    its "where it loses here" ledger.

    stall, prefix, chunked: as for `engine_claims`; sources:
    `serving_metrics.prefix_cache_sources` of the prefix-caching run; busy: the busy reason of
    "chunked" and "prefix", carried by the lines timed then. Thresholds are `engine_claims`'
    (LATENCY_GAIN, THROUGHPUT_KEPT)."""
    note = _busy_note(busy)
    lines = []
    without, with_ = chunked["without"], chunked["with"]
    gain, kept = without["itl_p99"] / with_["itl_p99"], with_["throughput"] / without["throughput"]
    if kept < THROUGHPUT_KEPT:
        lines.append(f"Chunked prefill kept {kept:.0%} of the throughput without it. A prompt split over several "
                     "steps adds a step's fixed cost for each chunk. And where a forward pass costs in proportion to "
                     f"its tokens, a smaller step is not cheaper per token.{note('chunked')}")
    if gain < LATENCY_GAIN:
        lines.append(f"Chunked prefill shortened the p99 inter-token latency only {gain:.2f}x. The stalls it "
                     f"removes were short here: a step with a whole prefill lasted {stall['ratio']:.2f}x a decode-only "
                     f"one.{note('chunked')}")
    plain, cached = prefix["without"], prefix["with"]
    faster = plain["ttft_p50"] / cached["ttft_p50"]
    if faster < LATENCY_GAIN:
        lines.append(f"Prefix caching brought the first token only {faster:.2f}x sooner at p50, computing "
                     f"{cached['prefill_tokens_computed'] / plain['prefill_tokens_computed']:.0%} of the prompt "
                     "tokens. Every request arrived at once, so most of the wait is the queue for a slot. A cheaper "
                     f"prefill does not shorten that queue.{note('prefix')}")
    if sources and sources["total"] and sources["repeated_prompt"]:
        lines.append(f"{sources['repeated_prompt'] / sources['total']:.0%} of the prompt tokens prefix caching saved "
                     f"came from the {sources['repeated_requests']} requests that repeat an earlier prompt word for "
                     f"word. With distinct prompts, only the {sources['common_prefix']} tokens every prompt shares "
                     "would be saved. Those are the chat template's system prompt, in full blocks.")
    return lines


def _busy_note(busy: Mapping[str, str | None] | None):
    """A function of a key: " This was timed while ..." where `busy` names a reason for it, else ""."""
    busy = busy or {}
    return lambda key: f" This was timed while {busy[key]}." if busy.get(key) else ""


NOTHING_LOST = ("Nothing measured here lost to its baseline. Every speed ratio was above 1/1.05. Chunked "
                "prefill kept its throughput, and prefix caching brought the first token 1.5x sooner or more.")


def serving_losses(speed: Mapping[str, float], metrics: Mapping[str, dict], stall: Mapping[str, float],
                   prefix: Mapping[str, dict], chunked: Mapping[str, dict], costs: Mapping[str, float] | None = None,
                   sources: Mapping[str, int] | None = None, busy: Mapping[str, str | None] | None = None) -> list[str]:
    """Both ledgers in one list, for the bench's serving section, which measures both halves:
    `batching_losses` then `engine_losses`, or one line saying nothing lost. Introduced in
    notebook 06 (continuous batching); the arguments are theirs."""
    lines = batching_losses(speed, metrics, costs, busy) + engine_losses(stall, prefix, chunked, sources, busy)
    return lines or [NOTHING_LOST]
