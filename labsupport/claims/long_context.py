"""The claims of notebook 08 (long context), each set against this run's measurements.

Introduced in notebook 08 (long context). Every verdict is computed here, with its
thresholds below, and tested with measurements that should hold, ones that should not,
and busy ones. A verdict that rests on timings goes through `busy.judge`: where the
machine looked busy (`long_context_busy_reason`), it says so instead of judging. Verdicts
on bytes (computed or allocated) and on logits need no quiet machine.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from ..lab.busy import busy_reason, judge, more_work_faster_reason

QUADRATIC_EXPONENT = 1.6      # naive memory or time "grows as T^2" when T x 2 multiplies it by 2^1.6 or more
LINEAR_EXPONENT = 1.2         # the fused kernel's memory "grows linearly" below T^1.2
SPEED_MARGIN = 1.05           # int8 is "faster" from 5% on, "slower" from 5% on
LOGIT_TOLERANCE = 0.02        # int8 logits within 2% of the largest logit at short context ...
TOKEN_AGREEMENT = 0.9         # ... and at least 90% of greedy tokens the same
PERPLEXITY_TOLERANCE = 0.01   # int8 perplexity within 1% of the float cache's


def _exponent(rows: Sequence[Mapping], x: str, y: str) -> float | None:
    """The growth exponent between the first and last row with a value: log(y ratio) / log(x ratio)."""
    points = [(r[x], r[y]) for r in rows if r.get(y)]
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    return math.log(points[-1][1] / points[0][1]) / math.log(points[-1][0] / points[0][0])


def long_context_busy_reason(prefill_rows: Sequence[Mapping] = (), share_rows: Sequence[Mapping] = (),
                             timed: Mapping[str, Mapping] | None = None, load: float | None = None) -> str | None:
    """Why notebook 08's timings cannot carry a verdict, or None when the run looked quiet.

    Introduced in notebook 08 (long context). prefill_rows: `prefill_attention_sweep`'s rows;
    share_rows: `decode_attention_share`'s; timed: more {name: Timing or Timing.to_dict()}
    (the variants', the int8-vs-float pair's); load: `busy.load_per_core()`. Signs: any
    spread, the load, and a step over a longer context far faster than one over a shorter.
    """
    figures = {f"{name} at T={r['T']}": t for r in prefill_rows for name, t in r.get("timings", {}).items()}
    figures.update({f"the {name[:-2]} at batch {r['batch']}, context {r['context']}": t
                    for r in share_rows for name, t in r.get("timings", {}).items()})
    figures.update(timed or {})
    reasons = [busy_reason(figures, load=load)]
    for batch in sorted({r["batch"] for r in share_rows}):
        points = [(r["context"], r["step_s"]) for r in share_rows if r["batch"] == batch]
        reasons.append(more_work_faster_reason(points, lambda n: f"context {n:.0f}, batch {batch}"))
    return "; ".join(r for r in reasons if r) or None


def _prefill_rows(prefill_rows: Sequence[Mapping], busy: str | None) -> list[dict]:
    naive = [r for r in prefill_rows if r.get("naive_s") is not None]
    memory_exponent = _exponent(naive, "T", "naive_bytes")
    fused_exponent = _exponent(prefill_rows, "T", "fused_bytes")
    time_exponent = _exponent(naive, "T", "naive_s")
    over = [r["T"] for r in prefill_rows if r["naive_over_budget"]]
    how = prefill_rows[0]["memory"] if prefill_rows else "computed"
    memory_holds = (memory_exponent is not None and memory_exponent >= QUADRATIC_EXPONENT
                    and fused_exponent is not None and fused_exponent <= LINEAR_EXPONENT)
    time_verdict = ("holds" if time_exponent is not None and time_exponent >= QUADRATIC_EXPONENT else
                    "partly: it grows faster than T, not yet as T^2" if time_exponent and time_exponent > 1 else
                    "not here: the naive time did not grow faster than T at these lengths")
    return [
        {"claim": "Naive attention materialises the T x T scores: its memory grows as T^2; the fused kernel's does not",
         "measured": (f"{how}: naive memory grows as T^{memory_exponent:.2f}, fused as T^{fused_exponent:.2f}"
                      if memory_exponent is not None and fused_exponent is not None else "too few lengths")
         + (f"; naive over the budget from T={over[0]}" if over else ""),
         "verdict": "holds" if memory_holds else "no: see the exponents"},
        {"claim": "Naive attention's time grows as T^2",
         "measured": f"naive time grows as T^{time_exponent:.2f}" if time_exponent is not None else "too few lengths",
         "verdict": judge(time_verdict, busy)},
    ]


SHARE_CLAIM = ("Decode attention stays memory-bound at any batch: each row reads its own cache, so its share "
               "of the step grows with the context")
VARIANTS_CLAIM = "Fewer kv-heads (MHA -> GQA -> MQA) shrink the cache and the decode attention time"
LOGITS_CLAIM = (f"(course) At short context the int8 cache's logits stay within {LOGIT_TOLERANCE:.0%} of the largest "
                f"logit, and the greedy tokens mostly agree")
QUALITY_CLAIM = "An int8 cache costs little quality"
WINDOW_CLAIM = "A sliding window caps the cache at W positions, at a cost in quality"


def _unmeasured(claim: str) -> dict:
    """The row of a claim whose measurement this run did not make (the bench leaves some to notebook 08)."""
    return {"claim": claim, "measured": "not measured in this run (notebook 08 measures it)",
            "verdict": "not measured here"}


def _share_row(share_rows: Sequence[Mapping] | None, busy: str | None) -> dict:
    if share_rows is None:
        return _unmeasured(SHARE_CLAIM)
    by_batch = {}
    for r in share_rows:
        by_batch.setdefault(r["batch"], []).append(r)
    grows = all(rows[-1]["attention_share"] > rows[0]["attention_share"] for rows in by_batch.values())
    batches = sorted(by_batch)
    longest = {b: by_batch[b][-1] for b in batches}
    larger_batch_more = len(batches) < 2 or longest[batches[-1]]["attention_share"] > longest[batches[0]]["attention_share"]
    text = "; ".join(f"batch {b}: {by_batch[b][0]['attention_share']:.0%} at {by_batch[b][0]['context']} -> "
                     f"{by_batch[b][-1]['attention_share']:.0%} at {by_batch[b][-1]['context']}" for b in batches)
    verdict = ("holds: attention's share grows with the context, and more at the larger batch" if grows and larger_batch_more
               else "partly: it grows with the context, not more at the larger batch" if grows
               else "not here: attention's share did not grow with the context")
    return {"claim": SHARE_CLAIM,
            "measured": f"attention's share of a decode step: {text}", "verdict": judge(verdict, busy)}


def _variants_row(variant_rows: Sequence[Mapping] | None, busy: str | None) -> dict:
    if variant_rows is None:
        return _unmeasured(VARIANTS_CLAIM)
    ordered = sorted(variant_rows, key=lambda r: -r["kv_heads"])
    first = ordered[0]
    exact = all(r["cache_bytes"] * first["kv_heads"] == first["cache_bytes"] * r["kv_heads"] for r in ordered)
    faster = all(a["attention_s"] > b["attention_s"] for a, b in zip(ordered, ordered[1:]))
    text = ", ".join(f"{r['variant']} ({r['kv_heads']} kv-heads): {r['cache_bytes'] / 2**20:.0f} MiB, attention "
                     f"{1e3 * r['attention_s']:.2f} ms" for r in ordered)
    verdict = ("holds: the cache shrinks by heads / kv-heads and attention gets faster" if exact and faster
               else "partly: the cache shrinks by heads / kv-heads, attention did not get faster each time" if exact
               else "no: the cache bytes are not proportional to the kv-heads")
    return {"claim": VARIANTS_CLAIM, "measured": text, "verdict": judge(verdict, busy if exact else None)}


def _int8_rows(int8_bytes: Mapping, int8_speed: Mapping, quality: Mapping | None, agreement: Mapping | None,
               busy: str | None) -> list[dict]:
    head_dim = int8_bytes["head_dim"]
    ideal_16 = 2 * head_dim / (head_dim + 2)                 # the scales' overhead: 2 bytes per head_dim values
    vs_16, vs_32 = int8_bytes["sixteen_bit"] / int8_bytes["int8"], int8_bytes["fp32"] / int8_bytes["int8"]
    bytes_holds = vs_16 >= ideal_16 - 1e-9 and vs_32 >= 2 * ideal_16 - 1e-9
    speed = int8_speed["float_s"] / int8_speed["int8_s"]
    speed_verdict = ("holds" if speed >= SPEED_MARGIN else
                     "not here: the int8 cache was slower; each read dequantizes the whole cache to float "
                     "before attention (no fused int8 attention kernel), an extra pass over memory"
                     if speed <= 1 / SPEED_MARGIN else "no measurable difference")
    return [
        {"claim": "An int8 KV cache halves the cache vs fp16/bf16 and quarters it vs fp32 (up to its scales)",
         "measured": f"allocated: {vs_16:.2f}x less than 16-bit, {vs_32:.2f}x less than fp32 "
                     f"(with one 2-byte scale per {head_dim} values: {ideal_16:.2f}x and {2 * ideal_16:.2f}x)",
         "verdict": "holds" if bytes_holds else "no: see the ratios"},
        {"claim": "The int8 cache decodes faster at long context (it reads fewer bytes)",
         "measured": f"decode step at context {int8_speed['context']}, batch {int8_speed['batch']}: "
                     f"float {1e3 * int8_speed['float_s']:.1f} ms, int8 {1e3 * int8_speed['int8_s']:.1f} ms ({speed:.2f}x)",
         "verdict": judge(speed_verdict, busy)},
        _logits_row(agreement), _quality_row(quality),
    ]


def _logits_row(agreement: Mapping | None) -> dict:
    if agreement is None:
        return _unmeasured(LOGITS_CLAIM)
    close = (agreement["relative_logit_difference"] <= LOGIT_TOLERANCE and agreement["same_tokens"] >= TOKEN_AGREEMENT)
    return {"claim": LOGITS_CLAIM,
            "measured": f"{agreement['new_tokens']} tokens: largest difference {agreement['relative_logit_difference']:.2%}"
                        f" of the largest logit, {agreement['same_tokens']:.0%} of tokens the same",
            "verdict": "holds" if close else "no: see the difference"}


def _quality_row(quality: Mapping | None) -> dict:
    if quality is None:
        return _unmeasured(QUALITY_CLAIM)
    ppl_change = quality["int8_ppl"] / quality["float_ppl"] - 1
    return {"claim": QUALITY_CLAIM,
            "measured": f"perplexity on {quality['tokens']} tokens: {quality['float_ppl']:.3f} (float cache) vs "
                        f"{quality['int8_ppl']:.3f} (int8), {ppl_change:+.2%}; top-1 agreement {quality['top1_agreement']:.1%}"
                        + (f"; KL divergence {quality['kl_divergence']:.1e} nats/token" if "kl_divergence" in quality else ""),
            "verdict": "holds" if abs(ppl_change) <= PERPLEXITY_TOLERANCE else f"no: {ppl_change:+.1%} perplexity"}


def _window_row(window_rows: Sequence[Mapping] | None) -> dict:
    if window_rows is None:
        return _unmeasured(WINDOW_CLAIM)
    full = next(r for r in window_rows if r["window"] is None)
    windows = sorted((r for r in window_rows if r["window"] is not None), key=lambda r: r["window"])
    capped = bool(windows) and all(r["cache_bytes"] < full["cache_bytes"] for r in windows)
    costs = capped and windows[0]["perplexity"] > full["perplexity"]
    text = ", ".join(f"W={r['window']}: {r['perplexity']:.2f} ({r['cache_bytes'] / full['cache_bytes']:.0%} of the cache)"
                     for r in windows) + f"; full attention: {full['perplexity']:.2f}"
    return {"claim": WINDOW_CLAIM,
            "measured": f"perplexity on the evaluation text: {text}",
            "verdict": ("holds: the cache is capped and the smallest window costs perplexity" if capped and costs else
                        "partly: the cache is capped, but no window cost perplexity here" if capped else
                        "no: no window was shorter than the text")}


def long_context_claims(prefill_rows: Sequence[Mapping], share_rows: Sequence[Mapping] | None,
                        crossovers: Sequence[Mapping], variant_rows: Sequence[Mapping] | None, int8_bytes: Mapping,
                        int8_speed: Mapping, quality: Mapping | None, agreement: Mapping | None,
                        window_rows: Sequence[Mapping] | None, busy: str | None = None) -> list[dict]:
    """Notebook 08's claims next to what it measured: rows (claim, measured, verdict) for
    `tables.records_table`.

    Introduced in notebook 08 (long context).

    prefill_rows: `prefill_attention_sweep`; share_rows: `decode_attention_share`;
    crossovers: [{"model", "batch", "context"}], contexts from `long_context_bytes.crossover_context`;
    variant_rows: `time_kv_variants`; int8_bytes: {"int8", "sixteen_bit", "fp32": bytes of
    the same cache, "head_dim"}; int8_speed: `time_cache_kinds`; quality:
    `kv_precision_quality`; agreement: `generation_agreement`; window_rows:
    `window_perplexity` (with a None window); busy: `long_context_busy_reason`. share_rows,
    variant_rows, quality, agreement or window_rows None: not measured in this run (the
    bench leaves them to notebook 08), and each of their rows says so.

    Thresholds: "as T^2" from an exponent of 1.6 (linear below 1.2); attention's share must
    grow with the context at every batch, and more at the larger one; int8 bytes exact up to
    a 2-byte scale per head_dim values; int8 faster from 5%; logits within 2% of the largest
    and 90% of tokens the same; perplexity within 1%.
    """
    crossover_text = "; ".join(f"{c['model']} at batch {c['batch']}: {c['context']:,.0f} tokens" for c in crossovers)
    closer = all(math.isclose(a["context"] * a["batch"], b["context"] * b["batch"], rel_tol=1e-9)
                 for a in crossovers for b in crossovers if a["model"] == b["model"])
    return [
        *_prefill_rows(prefill_rows, busy),
        _share_row(share_rows, busy),
        {"claim": "Past a crossover context a decode step reads more cache than weights; batching brings it closer",
         "measured": f"computed, not measured: {crossover_text}",
         "verdict": "holds (computed from the formula): n* = weight bytes / (batch x cache bytes per token)"
                    if closer else "no: the crossovers do not scale as 1 / batch"},
        _variants_row(variant_rows, busy),
        *_int8_rows(int8_bytes, int8_speed, quality, agreement, busy),
        _window_row(window_rows),
    ]


def long_context_section_claims(section: dict) -> list[dict]:
    """The long-context bench section's claims: `long_context_claims` of its ``prefill`` rows,
    ``crossovers``, ``int8_bytes`` and ``int8_speed``; the decode shares, the kv-head variants,
    the int8 cache's logits and perplexity and the sliding windows are notebook 08's (their rows
    say so). Busy: `long_context_busy_reason` of its timings and the suite's ``load_per_core``.

    Introduced in notebook 08 (long context)."""
    speed = section["int8_speed"]
    busy = long_context_busy_reason(section["prefill"], timed=speed.get("timings"), load=section.get("load_per_core"))
    return long_context_claims(section["prefill"], None, section["crossovers"], None, section["int8_bytes"],
                               speed, None, None, None, busy=busy)


def long_context_losses(prefill_rows: Sequence[Mapping], tile_run: Mapping | None, variant_rows: Sequence[Mapping],
                        int8_speed: Mapping, quality: Mapping | None, window_rows: Sequence[Mapping],
                        busy: str | None = None) -> list[str]:
    """Where notebook 08's techniques did not pay on this machine, one sentence each, from this
    run's measurements. Introduced in notebook 08 (long context): its "where it loses here" ledger.

    tile_run: `prefill_attention.tiled_vs_fused` on the learner's tiled attention (None: not run);
    the rest as for `long_context_claims`. Timing lines carry the busy reason when there is one."""
    lines = []
    note = f" This was timed while {busy}." if busy else ""
    naive_faster = [r for r in prefill_rows if r["naive_s"] is not None and r["naive_s"] * SPEED_MARGIN < r["fused_s"]]
    if naive_faster:
        r = naive_faster[0]
        lines.append(f"Fused attention lost to the naive one at T = {r['T']} ({1e3 * r['fused_s']:.2f} ms vs "
                     f"{1e3 * r['naive_s']:.2f} ms). At short prompts the T x T scores fit in the caches, and the "
                     f"bytes saved do not make up for the fused kernel's bookkeeping.{note}")
    if tile_run is not None and tile_run["tiled_s"] > SPEED_MARGIN * tile_run["fused_s"]:
        lines.append(f"The tiled attention written in torch took {tile_run['tiled_s'] / tile_run['fused_s']:.1f}x the "
                     f"fused kernel's time at T = {tile_run['T']}. Each tile is several separate torch calls, and "
                     "each call writes its result to memory. So the tile never stays in fast memory: the algorithm "
                     f"is faster only inside one kernel.{note}")
    ordered = sorted(variant_rows, key=lambda r: -r["kv_heads"])
    for fewer in ordered[1:]:
        if fewer["attention_s"] * SPEED_MARGIN > ordered[0]["attention_s"]:
            lines.append(f"{fewer['variant']} ({fewer['kv_heads']} kv-heads) attended in {1e3 * fewer['attention_s']:.2f} ms, "
                         f"not clearly less than {ordered[0]['variant']}'s {1e3 * ordered[0]['attention_s']:.2f} ms. "
                         f"At this size the attention calls' fixed cost outweighs the bytes saved.{note}")
    speed = int8_speed["float_s"] / int8_speed["int8_s"]
    if speed < SPEED_MARGIN:
        lines.append(f"The int8 cache ran at {speed:.2f}x the float cache's speed. It dequantizes the cache to a "
                     "float copy before attention. That is an extra pass over memory, and no fused int8 kernel "
                     f"removes it here.{note}")
    if quality is not None and quality["int8_ppl"] > quality["float_ppl"]:
        lines.append(f"The int8 cache cost perplexity {quality['float_ppl']:.3f} -> {quality['int8_ppl']:.3f} "
                     f"on {quality['tokens']} tokens: rounding, small at 8 bits.")
    windows = [r for r in window_rows if r["window"] is not None]
    full = next((r for r in window_rows if r["window"] is None), None)
    if windows and full is not None:
        smallest = min(windows, key=lambda r: r["window"])
        if smallest["perplexity"] > full["perplexity"]:
            lines.append(f"A window of {smallest['window']} positions moved perplexity {full['perplexity']:.2f} -> "
                         f"{smallest['perplexity']:.2f}: this model was trained with full attention.")
    return lines or ["Every technique helped here: nothing measured lost."]
