"""The handbook chapter's claims of notebook 02 (batching), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstrings, and tested with
measurements that should hold, measurements that should not, and busy ones. A verdict
drawn from timings goes through `busy.judge`: the spread of its timings, the load probe,
and, for the batch sweep, a larger batch that stepped far faster than a smaller one
(`busy.more_work_faster_reason`) all withhold it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..lab.batching import scaling_stops_at
from ..lab.busy import busy_reason, judge, more_work_faster_reason

SAME_WORK = (0.8, 1.25)        # two runs of the same work: a ratio inside this band is "1.0x"
CLAIMED_16, TARGET_16 = 10.0, 8.0
NEAR_RIDGE = 0.5               # scaling that stops from half the predicted ridge batch on is "near" it
KERNEL_SWITCH_BATCH = 2        # the first batch past 1: matrix-vector kernels give way to matrix-matrix
SORTING_PAYS = 1.05            # sorted prompts served at least 5% faster


def ridge_text(ridge: float) -> str:
    """The predicted ridge batch in words: "batch 12", or "no batch" when the cache grows as fast as the FLOPs.

    Introduced in notebook 02 (batching)."""
    return f"batch {ridge:.0f}" if ridge != float("inf") else "no batch (the cache grows as fast as the arithmetic)"


def loop_verdict(real_over_loop: float) -> str:
    """The chapter's 1.0x. Its "batched" function is a loop over the prompts, so the chapter's
    code has no batch to measure: its 1.0x holds by construction. What can be measured is a real
    batch of the same prompts against that loop (`real_over_loop`: loop time / batch time); a
    ratio within 0.8-1.25x counts as no gain.

    Introduced in notebook 02 (batching)."""
    low, high = SAME_WORK
    explained = "explained: the chapter's code has no batch (its 'batched' function is the loop, 1.0x by construction)"
    if real_over_loop > high:
        return f"{explained}; a real batch of the same prompts ran {real_over_loop:.2f}x the loop's speed here"
    if real_over_loop >= low:
        return f"{explained}; a real batch of the same prompts gained nothing here either ({real_over_loop:.2f}x)"
    return f"{explained}; a real batch of the same prompts was slower here ({real_over_loop:.2f}x the loop's speed)"


def headline_verdict(ratio_16: float) -> str:
    """Batch 16 over batch 1: holds from 10x, the course's 2-core target from 8x.

    Introduced in notebook 02 (batching)."""
    if ratio_16 >= CLAIMED_16:
        return "holds"
    return "course target (8x) met, below the claim" if ratio_16 >= TARGET_16 else "less here"


def regime_verdict(stops_at: int | None, ridge: float, largest: int, device_type: str = "cpu") -> str:
    """The claim "memory-bound at small batch, compute-bound at large", judged against the predicted ridge.

    Introduced in notebook 02 (batching). stops_at: the first batch whose throughput fell
    below half of ideal scaling (`batching.scaling_stops_at`), None if none did; ridge: the
    roofline's ridge batch (`roofline.ridge_batch`); largest: the largest batch swept.
    Holds when scaling stops at or past half the ridge batch, or runs over the whole sweep when
    the ridge lies beyond it. (A pure roofline's throughput stops growing at the ridge batch and
    falls below half of ideal at twice it, where a step takes twice batch 1's time; the margin
    down to half the ridge allows for the ridge's own error.) A stop at batch 2 on a CPU, well before the ridge, is the switch
    from matrix-vector to matrix-matrix kernels, not the roofline's crossing.
    """
    if stops_at is None:
        if ridge > largest:
            return (f"holds as far as measured: memory-bound over the whole sweep (to batch {largest}); "
                    f"the predicted ridge ({ridge_text(ridge)}) lies beyond it")
        return f"not here: scaling held past the predicted ridge ({ridge_text(ridge)})"
    if stops_at >= NEAR_RIDGE * ridge:
        return f"holds: scaling stops at batch {stops_at}, near or past the predicted ridge ({ridge_text(ridge)})"
    if stops_at == KERNEL_SWITCH_BATCH and device_type == "cpu":
        return (f"not the roofline: scaling stops at batch 2, far below the predicted ridge ({ridge_text(ridge)}); "
                "there the CPU's matrix multiplies switch from matrix-vector to matrix-matrix kernels")
    return (f"partly: scaling stops at batch {stops_at}, before the predicted ridge ({ridge_text(ridge)}): "
            "costs per row other than the weights (small operations, the prefill) come first")


def padding_verdict(waste: float, sorted_waste: float, padded_over_sorted: float) -> str:
    """Sorting by length helps: holds when it cuts the waste and serves at least 5% faster.

    Introduced in notebook 02 (batching)."""
    if sorted_waste >= waste:
        return "nothing to gain: sorting did not reduce the padding of these prompts"
    if padded_over_sorted >= SORTING_PAYS:
        return "holds"
    return "partly: sorting cut the padding, but the run was not faster here"


def batch_sweep_busy_reason(sweep: Sequence[dict], load: float | None = None) -> str | None:
    """Why a batch sweep cannot carry a verdict, or None: the load probe, or a larger batch whose
    decode step ("ms_per_token", else "ms_per_step") took far less time than a smaller batch's.

    Introduced in notebook 02 (batching)."""
    key = "ms_per_token" if all("ms_per_token" in r for r in sweep) else "ms_per_step"
    order = more_work_faster_reason([(r["batch"], r[key]) for r in sweep], lambda b: f"batch {b:.0f}")
    return "; ".join(r for r in (busy_reason(load=load), order) if r) or None


def batching_claims(*, real_over_loop: float | None, ratio_16: float, sweep: Sequence[dict], ridge: float,
                    waste: float, sorted_waste: float, padded_over_sorted: float | None,
                    timings: Mapping[str, Mapping] | None = None, device_type: str = "cpu",
                    load: float | None = None) -> list[dict]:
    """The handbook chapter's batching claims next to what notebook 02 measured.

    Introduced in notebook 02 (batching). Returns rows (claim, measured, verdict) for
    `tables.records_table`.

    real_over_loop: the chapter's loop over the prompts timed against one real batch of them
    (loop time / batch time); ratio_16: throughput at batch 16
    over batch 1; sweep: `batching_timing.sweep_batch_sizes`'s rows; ridge: the predicted
    ridge batch; waste, sorted_waste: padding of the prompts as they come and sorted;
    padded_over_sorted: time as they come / time sorted. timings: the `measure.Timing`s
    behind each ratio, {"loop": ..., "headline": ..., "padding": ...}, each {name: Timing};
    load: `busy.load_per_core()`. Thresholds: `loop_verdict`, `headline_verdict`,
    `regime_verdict`, `padding_verdict`. real_over_loop or padded_over_sorted None: not timed in
    this run (the bench times neither; notebook 02 does), and that row says so.
    """
    timings = timings or {}
    stops_at = scaling_stops_at(sweep)
    largest = max(r["batch"] for r in sweep)

    def busy(name):
        return busy_reason(timings.get(name, {}), load=load)

    untimed = {"measured": "not timed in this run (notebook 02 times it)", "verdict": "not measured here"}
    return [
        {"claim": "batching 4 prompts: 1.0x speedup (the chapter's code)",
         **(untimed if real_over_loop is None else
            {"measured": "nothing to measure in the chapter's code: its 'batched' function loops over the prompts "
                         f"one at a time; one real batch of them against that loop: {real_over_loop:.2f}x",
             "verdict": judge(loop_verdict(real_over_loop), busy("loop"))})},
        {"claim": "batch 1 -> 16: 10-15x throughput",
         "measured": f"{ratio_16:.1f}x tokens/s, measured side by side",
         "verdict": judge(headline_verdict(ratio_16), busy("headline"))},
        {"claim": "small batches memory-bound, large ones compute-bound",
         "measured": (f"throughput falls below half of ideal scaling at batch {stops_at}" if stops_at else
                      f"throughput within half of ideal scaling up to batch {largest}")
                     + f"; roofline ridge at {ridge_text(ridge)}",
         "verdict": judge(regime_verdict(stops_at, ridge, largest, device_type), batch_sweep_busy_reason(sweep, load))},
        {"claim": "(not in the chapter) padding wastes work; sorting by length helps",
         **({"measured": f"{waste:.0%} of prompt slots padding, {sorted_waste:.0%} sorted; the sorted run "
                         "not timed in this run (notebook 02 times it)", "verdict": "not measured here"}
            if padded_over_sorted is None else
            {"measured": f"{waste:.0%} of prompt slots padding, {sorted_waste:.0%} sorted; "
                         f"sorted run {padded_over_sorted:.2f}x faster",
             "verdict": judge(padding_verdict(waste, sorted_waste, padded_over_sorted), busy("padding"))})},
    ]


def batching_section_claims(section: dict) -> list[dict]:
    """The batching bench section's claims: `batching_claims` of the section's dict (its
    ``sweep``, ``batch16_over_batch1`` and its timings, ``padding``, ``ridge_batch``,
    ``device_type`` and the suite's ``load_per_core``). The bench does not time the chapter's
    loop against a real batch nor the sorted batches: those rows say so.

    Introduced in notebook 02 (batching)."""
    padding = section["padding"]
    return batching_claims(real_over_loop=None, ratio_16=section["batch16_over_batch1"], sweep=section["sweep"],
                           ridge=section["ridge_batch"], waste=padding["waste"], sorted_waste=padding["sorted_waste"],
                           padded_over_sorted=None, timings={"headline": section["timings_s"]},
                           device_type=section["device_type"], load=section.get("load_per_core"))
