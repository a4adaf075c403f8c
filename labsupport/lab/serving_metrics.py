"""What a server is judged by: throughput, time to first token, latency, slot use.

Introduced in notebook 06 (continuous batching).

* throughput: generated tokens per second over the whole run (the operator's view);
* time to first token (TTFT): arrival -> first token (how long a user stares at nothing);
* latency: arrival -> last token; reported at the median (p50) and the tail (p99),
  because one user in a hundred waiting ten times longer is what people remember;
* inter-token latency (ITL): the gap between two consecutive tokens of one answer,
  pooled over every answer (a stall while a long prompt is prefilled shows up here);
* time per output token (TPOT): per request, (last token - first token) / (tokens - 1);
* prefill tokens computed, and prompt tokens taken from the prefix cache instead;
* slot utilization: the fraction of batch slots doing useful work in each step.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import LabError
from ..inputs import finite_number, whole_number


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100) of `values`, or nan when there are none.
    Notebook 06 (continuous batching)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


# --- one request's times, and goodput: the one home of these formulas (06, 09, 10) -----------

def time_per_output_token(first: float, last: float, tokens: int) -> float | None:
    """A request's time per output token (TPOT): (last token - first token) / (tokens - 1), the
    mean gap between its later tokens; None below two tokens. Notebook 06 (continuous batching)."""
    return (last - first) / (tokens - 1) if tokens >= 2 else None


def request_times(arrival: float, first: float, last: float, tokens: int) -> dict:
    """One request's "ttft" (first token - arrival), "tpot" (0.0 below two tokens: a one-token answer
    meets any TPOT objective) and "finished" (its last token), in seconds on one clock.
    Notebook 06 (continuous batching); notebooks 09 and 10 judge goodput by these rows."""
    tpot = time_per_output_token(first, last, tokens)
    return {"ttft": first - arrival, "tpot": 0.0 if tpot is None else tpot, "finished": last}


def goodput(rows: list[dict], ttft_slo: float, tpot_slo: float, start: float = 0.0,
            requests: int | None = None) -> dict:
    """Goodput: the requests per second that met both service-level objectives (ttft <= ttft_slo
    and tpot <= tpot_slo) over the span from `start` to the last "finished", with the share of all
    `requests` that met them (default: the rows; a request that failed is a row missing, so missed).

    rows: `request_times` dicts. Introduced in notebook 09 (serving over HTTP); notebook 10 judges
    disaggregated serving by it. No rows out of `requests` sent is a goodput of 0 (none met); no
    rows and no requests, a span of no length, objectives not finite and > 0: one sentence."""
    ttft_slo = finite_number(ttft_slo, "ttft_slo (seconds)", minimum=0, above_minimum=True)
    tpot_slo = finite_number(tpot_slo, "tpot_slo (seconds per token)", minimum=0, above_minimum=True)
    start = finite_number(start, "start (seconds)")
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
        got = (f"a {type(rows).__name__}" if not isinstance(rows, (list, tuple)) else
               f"an item of type {next(type(r).__name__ for r in rows if not isinstance(r, dict))}")
        raise LabError("goodput's rows must be a list of dicts with 'ttft', 'tpot' and 'finished' in seconds "
                       f"(request_times makes one per request); got {got}.")
    requests = len(rows) if requests is None else whole_number(requests, "requests (all the requests sent)", 0)
    if requests < max(len(rows), 1):
        raise LabError(f"goodput needs at least one request, and at least as many as rows ({len(rows)}); "
                       f"got requests={requests}.")
    for key in ("ttft", "tpot", "finished"):
        bad = [r.get(key) for r in rows if not _is_seconds(r.get(key))]
        if bad:
            raise LabError(f"Every row needs a finite {key!r} in seconds; {len(bad)} row(s) have {bad[0]!r:.40}.")
    met = sum(r["ttft"] <= ttft_slo and r["tpot"] <= tpot_slo for r in rows)
    span = max(r["finished"] for r in rows) - start if rows else 0.0
    if rows and span <= 0:
        raise LabError(f"The last token came {span:g} s after the start: goodput is a rate over a span, "
                       "so the rows' finished times must come after start.")
    return {"goodput": met / span if rows else 0.0, "met": met / requests, "ttft_slo": ttft_slo,
            "tpot_slo": tpot_slo}


def _is_seconds(value) -> bool:
    """Whether `value` is a finite real number (not a bool; an int too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def summarize(result) -> dict:
    """The headline numbers of a `ServingResult`, as a flat dict. Notebook 06 (continuous batching)."""
    done = [s for s in result.sequences if s.is_finished]
    if not done:
        return {"requests": 0, "tokens": 0, "throughput_tokens_per_s": float("nan")}
    start = min(s.request.arrival for s in done)
    end = max(s.finished_at for s in done)
    tokens = sum(len(s.output) for s in done)
    ttft = [s.first_token_at - s.request.arrival for s in done]
    latency = [s.finished_at - s.request.arrival for s in done]
    busy = [r.decode_rows + max(r.prefills, r.prefill_chunks) for r in result.steps]
    gaps = [b - a for s in done for a, b in zip(s.token_times, s.token_times[1:])]
    tpot = [t for s in done if (t := time_per_output_token(s.first_token_at, s.finished_at, len(s.output))) is not None]
    return {
        "policy": result.policy,
        "max_slots": result.max_slots,
        "requests": len(done),
        "rejected": len(result.rejected),
        "tokens": tokens,
        "duration": end - start,
        "steps": len(result.steps),
        "throughput_tokens_per_s": tokens / (end - start) if end > start else float("nan"),
        "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
        "tpot_p50": percentile(tpot, 50), "tpot_p99": percentile(tpot, 99),
        "latency_p50": percentile(latency, 50), "latency_p99": percentile(latency, 99),
        "slot_utilization": float(np.mean([min(b, result.max_slots) / result.max_slots for b in busy])),
        "preemptions": sum(s.preemptions for s in result.sequences),
        "peak_cache_bytes": result.peak_blocks * result.block_bytes,
        "prefill_tokens_computed": sum(r.prefill_tokens for r in result.steps),
        "prefix_cached_tokens": sum(r.cached_tokens for r in result.steps),
        "token_budget": result.token_budget,
        "prefix_caching": result.prefix_caching,
    }


def utilization_timeline(result) -> dict:
    """Per step: its start and end time and the fraction of slots in use (for a plot).
    Notebook 06 (continuous batching)."""
    return {
        "start": [r.start for r in result.steps],
        "end": [r.end for r in result.steps],
        "busy_slots": [min(r.decode_rows + max(r.prefills, r.prefill_chunks), result.max_slots)
                       for r in result.steps],
        "prefill_tokens": [r.prefill_tokens for r in result.steps],
        "cached_tokens": [r.cached_tokens for r in result.steps],
        "padding_rows": [r.padding_rows for r in result.steps],
        "max_slots": result.max_slots,
    }


def slot_bars(result) -> list[dict]:
    """One bar per stay of a request in a slot: {request, slot, start, end, preempted}.
    Notebook 06 (continuous batching)."""
    bars = []
    for seq in result.sequences:
        for i, (slot, start, end) in enumerate(seq.slot_spans):
            bars.append({"request": seq.id, "slot": slot, "start": start,
                         "end": end if end is not None else start,
                         "preempted": i < len(seq.slot_spans) - 1, "tokens": len(seq.output)})
    return bars


def reserved_vs_used(result, max_length: int) -> dict:
    """Cache bytes a per-slot reservation of `max_length` positions would hold, against
    the paged cache's peak use in this run. Notebook 06 (continuous batching)."""
    bytes_per_position = result.block_bytes / result.block_size
    reserved = result.max_slots * max_length * bytes_per_position
    return {"reserved_bytes": reserved, "used_bytes": result.peak_blocks * result.block_bytes}


def _shared_full_blocks(a, b, block_size: int) -> int:
    """Positions in the full blocks that token lists `a` and `b` begin with alike."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same // block_size * block_size


def prefix_cache_sources(result) -> dict:
    """Where the prompt tokens a prefix-caching run took from the cache came from, request by
    request: the prefix that every prompt of the workload shares (the chat template's system
    prompt), an earlier request with the very same prompt (a workload that repeats its
    questions), or another earlier prompt that begins alike beyond the shared prefix.

    Introduced in notebook 06b (chunked prefill and prefix caching). Rebuilt from the prompts and the order of
    admission: a newcomer finds the full blocks of the prompts admitted in earlier steps (whole
    prompts prefilled at admission, i.e. no token budget) and computes at least its last prompt
    token. `matches_run` says whether the rebuilt total equals the run's own count (False when
    the cache evicted blocks, or a budget split the prompts). Returns {"shared_prefix",
    "repeated_prompt", "other_prefix", "total", "run_total", "repeated_requests", "requests",
    "common_prefix", "matches_run"}."""
    size = result.block_size
    seqs = sorted((s for s in result.sequences if s.slot_spans), key=lambda s: s.slot_spans[0][1])
    prompts = [list(s.request.prompt) for s in result.sequences]
    common = min((_shared_full_blocks(prompts[0], p, 1) for p in prompts), default=0)
    common_blocks = common // size * size
    shares = {"shared_prefix": 0, "repeated_prompt": 0, "other_prefix": 0}
    repeated = 0
    for i, seq in enumerate(seqs):
        prompt, admitted = list(seq.request.prompt), seq.slot_spans[0][1]
        earlier = [list(q.request.prompt) for q in seqs[:i] if q.slot_spans[0][1] < admitted]
        repeat = prompt in [list(s.request.prompt) for s in seqs[:i]]
        repeated += repeat
        hit = max((min(_shared_full_blocks(prompt[:-1], q, size), len(q) // size * size) for q in earlier),
                  default=0)
        shares["shared_prefix"] += min(hit, common_blocks)
        shares["repeated_prompt" if prompt in earlier else "other_prefix"] += max(hit - common_blocks, 0)
    total = sum(shares.values())
    run_total = sum(r.cached_tokens for r in result.steps)
    return {**shares, "total": total, "run_total": run_total, "repeated_requests": repeated,
            "requests": len(seqs), "common_prefix": common, "matches_run": total == run_total}


def side_by_side_rounds(timings) -> dict:
    """How notebook 06's servers were timed side by side (`measure.time_side_by_side`): the
    number of timed rounds, the order of each (the first server moves to the end from one
    round to the next), each server's seconds per round and their relative spread (max - min
    under 4 rounds, else the interquartile range, over the median).

    Introduced in notebook 06 (continuous batching). timings: name -> `Timing`, in the order
    the servers were given. Returns {"rounds", "orders", "seconds", "spread"}."""
    from .busy import relative_spread
    names = list(timings)
    rounds = min((len(t.samples) for t in timings.values()), default=0)
    orders = [names[i % len(names):] + names[:i % len(names)] for i in range(rounds)]
    return {"rounds": rounds, "orders": orders, "seconds": {n: list(t.samples) for n, t in timings.items()},
            "spread": {n: relative_spread(t) for n, t in timings.items()}}
