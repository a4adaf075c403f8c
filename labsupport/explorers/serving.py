"""Notebook 06's explorer: arrival rate, batch slots and policy, live.

Introduced in notebook 06 (continuous batching).

Each setting serves one small seeded workload (a dozen requests, long-tailed short
answers) with the real engine on the notebook's model, on the "steps" clock: time
is counted in engine steps, so arrival rates are in requests per step and the
figures are the same on every machine (a step with all slots busy costs about the
same as one with a single row, notebook 02). The wall time of the run is shown too.
Two figures are redrawn: the slot timeline of the current setting, and throughput
and latency percentiles of every setting measured so far. Results are cached, so
going back to a setting shows at once.
"""

from __future__ import annotations

import time

import ipywidgets as widgets

from ..plots.serving import settings_figure, slot_timeline_figure
from ..serving import Engine, make_workload
from .base import Explorer

RATES = {"all at once": None, "1 per step": 1.0, "1 per 2 steps": 0.5, "1 per 4 steps": 0.25,
         "1 per 8 steps": 0.125}


def serving_explorer(model, prompts: list[list[int]], count: int = 12, median_new_tokens: float = 6,
                     max_new_tokens: int = 32, max_slots: int = 8, block_size: int = 16,
                     use_widget: bool | None = None) -> Explorer:
    """Controls: arrival rate (requests per engine step), batch slots, policy.

    Introduced in notebook 06 (continuous batching).
    prompts: token-id prompts, reused in turn; `count` requests with log-normal answer
    lengths (median `median_new_tokens`, sigma 1.2, at most `max_new_tokens`), seed 0.
    """
    results: dict = {}
    holder: dict = {}

    def progress(done, total):
        explorer = holder.get("explorer")
        if explorer is not None:
            explorer.status.value = f"<i>serving... {done}/{total} requests done</i>"

    def label(rate_name, slots, policy):
        return f"{policy}, {slots} slots, {rate_name}"

    def measure(rate_name, slots, policy):
        key = label(rate_name, slots, policy)
        if key not in results:
            requests = make_workload(prompts, count=count, rate=RATES[rate_name],
                                     median_new_tokens=median_new_tokens, sigma=1.2,
                                     max_new_tokens=max_new_tokens, seed=0)
            longest = max(r.max_length for r in requests)
            start = time.perf_counter()
            run = Engine(model, max_slots=slots, policy=policy, block_size=block_size,
                         cache_tokens=slots * longest).run(requests, clock="steps", progress=progress)
            seconds = time.perf_counter() - start
            m = run.metrics()
            results[key] = {"run": run, "seconds": seconds, "row": {
                "label": key, "policy": policy, "throughput": m["throughput_tokens_per_s"],
                "ttft_p50": m["ttft_p50"], "latency_p50": m["latency_p50"], "latency_p99": m["latency_p99"],
                "tokens": m["tokens"], "utilization": m["slot_utilization"]}}
        return results[key]

    def render(values):
        current = measure(values["rate"], int(values["slots"]), values["policy"])
        row = current["row"]
        title = (f"{row['label']}<br><sup>{row['tokens']} tokens, {row['throughput']:.2f} tokens/step, "
                 f"slot use {row['utilization']:.0%}, {row['tokens'] / current['seconds']:.1f} tokens/s wall</sup>")
        timeline = slot_timeline_figure({values["policy"]: current["run"]}, clock="steps", title=title,
                                        height=400)
        return [timeline, settings_figure([r["row"] for r in results.values()], current=row["label"],
                                          clock="steps")]

    controls = {
        "rate": widgets.Dropdown(options=list(RATES), value="all at once", description="arrivals"),
        "slots": widgets.IntSlider(value=min(4, max_slots), min=1, max=max_slots, description="batch slots",
                                   continuous_update=False),
        "policy": widgets.ToggleButtons(options=["static", "continuous"], value="continuous",
                                        description="policy"),
    }
    explorer = Explorer(controls, render, title="Serving: arrival rate, batch slots, policy",
                        use_widget=use_widget)
    holder["explorer"] = explorer
    return explorer
