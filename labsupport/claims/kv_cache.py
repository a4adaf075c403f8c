"""The handbook chapter's claims of notebook 01 (KV cache), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstrings, and tested with
measurements that should hold, measurements that should not, and busy ones.

A timing can be disturbed in a way its own spread does not show: on a CPU each step is
timed once. One more sign is then cheap and certain: more work never takes much less
time. When a step over a longer sequence (or a larger batch, notebook 02) takes under
half the time of a step over a shorter one, the shorter one was slowed down by
something else (notebook 00's sweep uses the same sign). `busy.more_work_faster_reason`
says so, and the verdicts built on those timings give way to `busy.BUSY_VERDICT`.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from ..lab.busy import busy_reason, judge, more_work_faster_reason

HOLDS_SPEEDUP = 1.5        # the cache "wins" at the longest length from 1.5x on
SOME_SPEEDUP = 1.05        # below this the cache gained nothing measurable
SMALL_NEXT_TO_WEIGHTS = 0.05   # a cache under 5% of the weights is a rounding error next to them


def _join(*reasons: str | None) -> str | None:
    """The reasons that are not None, as one sentence (None if there are none)."""
    return "; ".join(r for r in reasons if r) or None


def step_busy_reason(step_rows: Sequence[dict], full_run_timings: Mapping[int, Mapping] | None = None,
                     load: float | None = None) -> str | None:
    """Why notebook 01's timings cannot carry a verdict, or None when the run looked quiet.

    Introduced in notebook 01 (KV cache). step_rows: `kv_cache_timing.time_per_token_by_position`'s
    rows (their ``timings`` give each step's spread); full_run_timings: {new tokens:
    {"cached_s" or "naive_s": Timing or Timing.to_dict()}} of the full runs; load:
    `busy.load_per_core()`. Three signs: the spread of any figure, the load, and a step
    over a longer sequence far faster than one over a shorter sequence (either mode).
    """
    figures = {f"the {mode[:-2]} step at {row['sequence_length']} tokens": timing
               for row in step_rows for mode, timing in row.get("timings", {}).items()}
    figures.update({f"the {mode[:-2]} full run of {n} tokens": timing
                    for n, timings in (full_run_timings or {}).items() for mode, timing in timings.items()})
    order = [more_work_faster_reason([(r["sequence_length"], r[mode]) for r in step_rows if mode in r],
                                 lambda n: f"{n:.0f} tokens{' without the cache' if mode == 'naive_s' else ''}")
             for mode in ("naive_s", "cached_s")]
    return _join(busy_reason(figures, load=load), *order)


def _speedup_verdict(speedups: Mapping[int, float], same_tokens: bool) -> str:
    """Holds when the cache wins at the longest length (>= 1.5x) and wins more there than at the shortest."""
    if not same_tokens:
        return "no: the cached loop gave other tokens than the uncached one"
    shortest, longest = speedups[min(speedups)], speedups[max(speedups)]
    if longest >= HOLDS_SPEEDUP and (len(speedups) == 1 or longest > shortest):
        return "holds: the cache wins, and wins more the longer the generation"
    if longest >= SOME_SPEEDUP:
        return "partly: the cache is faster, but its gain does not grow with the length here"
    return "not here: the cache was not faster at these lengths"


def kv_cache_claims(speedups: Mapping[int, float], full_run_lengths: Collection[int], same_tokens: bool,
                    memory: Sequence[tuple[int, int, int]], gqa: Mapping, seven_b: Mapping,
                    busy: str | None = None) -> list[dict]:
    """The handbook chapter's KV-cache claims, and the course's, next to what notebook 01 measured.

    Introduced in notebook 01 (KV cache). Returns rows (claim, measured, verdict) for
    `tables.records_table`.

    speedups: {new tokens: uncached time / cached time}; full_run_lengths: the lengths run
        in full (the others are estimates from per-step times); same_tokens: every full run
        gave the same tokens with and without the cache.
    memory: (length, formula bytes, bytes a StaticKVCache allocated) per length tried.
    gqa: bytes allocated at one length with the model's key/value heads ("gqa_bytes") and
        with one per query head ("mha_bytes"), and "num_heads", "kv_heads".
    seven_b: computed (not measured) bytes of a 7B-class model: "weights", "at_512", "at_128k".
    busy: `step_busy_reason` of the timings behind the speedups (None: a quiet run).

    Thresholds: the speedup claim holds when the cache is at least 1.5x faster at the
    longest length and faster there than at the shortest ("partly" from 1.05x), with the
    same tokens; it goes through `busy.judge`. The formula holds when it equals the
    allocation at every length; GQA when the allocation shrinks by exactly heads / kv-heads;
    the 512 -> 128K claim, arithmetic only, when the cache is under 5% of the weights at 512
    tokens and over the weights at 128K.
    """
    def how(n):
        return "measured" if n in full_run_lengths else "estimated"

    speed_text = ", ".join(f"{speedups[n]:.1f}x at {n} new tokens ({how(n)})" for n in sorted(speedups))
    tokens_text = "same tokens" if same_tokens else "TOKENS DIFFER"

    mismatched = [length for length, formula, allocated in memory if formula != allocated]
    lengths = [length for length, _, _ in memory]
    formula_text = (f"formula = allocated bytes at every length tried ({min(lengths)} to {max(lengths)} tokens)"
                    if not mismatched else f"formula and allocation differ at {mismatched} tokens")

    ratio, expected = gqa["mha_bytes"] / gqa["gqa_bytes"], gqa["num_heads"] / gqa["kv_heads"]
    weights, at_512, at_128k = seven_b["weights"], seven_b["at_512"], seven_b["at_128k"]
    long_holds = at_512 < SMALL_NEXT_TO_WEIGHTS * weights and at_128k > weights
    return [
        {"claim": "Generation loops build on a KV cache (\"beyond KV caching\"); without it every step "
                  "recomputes the whole sequence",
         "measured": f"cache vs no cache: {speed_text}; {tokens_text} in the full runs",
         "verdict": judge(_speedup_verdict(speedups, same_tokens), busy if same_tokens else None)},
        {"claim": "The cache mattered more as contexts grew from 512 to 128K tokens",
         "measured": f"computed, not measured: a 7B-class model in fp16 needs {at_512 / 2**20:.0f} MiB at 512 "
                     f"tokens ({at_512 / weights:.1%} of its weights) and {at_128k / 2**30:.0f} GiB at 128K "
                     f"({at_128k / weights:.1f}x its weights)",
         "verdict": "holds (computed from the formula)" if long_holds else "partly (computed from the formula)"},
        {"claim": "(course) cache size = layers x 2 x kv-heads x head-dim x length x batch x bytes",
         "measured": formula_text,
         "verdict": "holds" if not mismatched else "no: see the lengths where they differ"},
        {"claim": "(course) grouped-query attention shrinks the cache by heads / kv-heads",
         "measured": f"{ratio:.2f}x less allocated with {gqa['kv_heads']} kv heads than with "
                     f"{gqa['num_heads']} (heads / kv-heads = {expected:.2f})",
         "verdict": "holds" if abs(ratio - expected) < 1e-9 else f"no: {ratio:.2f}x instead of {expected:.2f}x"},
    ]


def kv_cache_section_claims(section: dict) -> list[dict]:
    """The KV-cache bench section's claims: `kv_cache_claims` of the section's dict (its full
    ``rows`` and ``estimated_rows``, ``memory``, ``gqa_allocated``, ``seven_b``, the per-step
    timings behind the estimates and the suite's ``load_per_core``).

    Introduced in notebook 01 (KV cache)."""
    rows, estimated = section["rows"], section.get("estimated_rows", [])
    speedups = {r["new_tokens"]: r["speedup"] for r in [*rows, *estimated]}
    full_runs = {r["new_tokens"]: {f"{mode}_s": timing for mode, timing in r["timings_s"].items()} for r in rows}
    busy = step_busy_reason(section["per_position_s"], full_runs, load=section.get("load_per_core"))
    return kv_cache_claims(speedups, full_runs.keys(), all(r["same_tokens"] for r in rows),
                           [tuple(m) for m in section["memory"]], section["gqa_allocated"], section["seven_b"],
                           busy=busy)
