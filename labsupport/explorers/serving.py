"""Notebooks 06 and 06b's explorer: arrival rate and policy (06), token budget and prefix caching (06b), live.

Introduced in notebook 06 (continuous batching) and notebook 06b (chunked prefill and prefix caching).

Each setting serves one small seeded workload (the same requests every time; only their
arrival times change with the rate) with the real engine on the notebook's model, on the
wall clock: a prefill that stalls the decodes shows as a long gap between two tokens, which
a clock counting engine steps would hide. Rates are fractions of the capacity the notebook
measured (requests per second when all arrive at once), so "90%" means close to saturation
on any machine. Two figures are redrawn: the phase timeline of the current setting (prefill
chunks, decodes and cached prompt tokens) and throughput and latency percentiles of every
setting measured so far. Results are cached, so going back to a setting shows at once; the
explorer opens with the settings the notebook already measured.
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import ipywidgets as widgets

from ..plots.serving import phase_timeline_figure
from ..plots.serving_settings import settings_figure
from ..engine.serving import Engine
from ..lab.load_curve import at_rate
from .base import Explorer
from ..lab.serving_metrics import summarize

LOADS = {"all at once": None, "25% of capacity": 0.25, "50% of capacity": 0.5, "90% of capacity": 0.9,
         "150% of capacity": 1.5}


def setting_label(load: str, policy: str, budget: int | None, prefix: bool) -> str:
    """The name of one explorer setting, as its figures show it. Introduced in notebook 06 (continuous batching)."""
    return (f"{policy}, {'no budget' if budget is None else f'budget {budget}'}, "
            f"{'prefix cache' if prefix else 'no prefix cache'}, {load}")


def short_label(load: str, policy: str, budget: int | None, prefix: bool) -> str:
    """The row label of one setting in the figure of every setting measured so far: policy,
    budget, prefix cache and arrival rate on one line. Introduced in notebook 06b (chunked prefill and prefix
    caching)."""
    rate = load.replace(" of capacity", "")
    return " · ".join([policy, "no budget" if budget is None else f"budget {budget}",
                       "prefix cache" if prefix else "no prefix", rate])


def serving_explorer(model, requests: Sequence, capacity: float, max_slots: int = 8, block_size: int = 16,
                     budgets: Sequence[int] = (16, 32, 64), opening: Mapping[tuple, object] | None = None,
                     loads: Mapping[str, float | None] = LOADS, chunking: bool = True,
                     use_widget: bool | None = None) -> Explorer:
    """Controls: arrival rate (a fraction of `capacity`), policy, token budget, prefix caching.

    Introduced in notebook 06 (continuous batching) with chunking=False: the arrival rate and
    the policy only; notebook 06b (chunked prefill and prefix caching) adds the token budget
    and the prefix cache.
    requests: the workload (`make_workload`; its arrival times are replaced at each rate);
    capacity: requests per second served when all arrive at once (`load_curve.saturation_rate`);
    budgets: the token budgets offered besides "off" (each at least `max_slots`); loads: the
    arrival rates offered, name -> fraction of `capacity` (None: all at once); opening: runs the
    notebook already made on the same requests, by (load name, policy, budget or None, prefix
    caching), shown without serving them again.
    """
    results: dict = {}
    holder: dict = {}
    longest = max(r.max_length for r in requests)

    def progress(done, total):
        explorer = holder.get("explorer")
        if explorer is not None:
            explorer.status.value = f"<i>serving... {done}/{total} requests done</i>"

    def keep(key, run, seconds):
        m = summarize(run)
        results[key] = {"run": run, "seconds": seconds, "row": {
            "label": short_label(*key), "name": setting_label(*key), "policy": key[1],
            "throughput": m["throughput_tokens_per_s"],
            "ttft_p50": m["ttft_p50"], "latency_p50": m["latency_p50"], "latency_p99": m["latency_p99"],
            "itl_p99": m["itl_p99"], "tokens": m["tokens"], "computed": m["prefill_tokens_computed"],
            "cached": m["prefix_cached_tokens"]}}

    def measure(key):
        if key not in results:
            load, policy, budget, prefix = key
            rate = None if loads[load] is None else loads[load] * capacity
            start = time.perf_counter()
            run = Engine(model, max_slots=max_slots, policy=policy, block_size=block_size,
                         cache_tokens=max_slots * longest, token_budget=budget,
                         prefix_caching=prefix).run(at_rate(requests, rate), progress=progress)
            keep(key, run, time.perf_counter() - start)
        return results[key]

    for key, run in (opening or {}).items():
        keep(tuple(key), run, float("nan"))

    def render(values):
        budget = None if values.get("budget", "off") == "off" else int(values["budget"])
        current = measure((values["load"], values["policy"], budget, values.get("prefix") == "on"))
        row = current["row"]
        title = (f"{row['name']}<br><sup>{row['tokens']} tokens at {row['throughput']:.1f} tokens/s; inter-token "
                 f"latency p99 {1e3 * row['itl_p99']:.0f} ms<br>{row['computed']} prompt tokens computed, "
                 f"{row['cached']} from the prefix cache</sup>")
        timeline = phase_timeline_figure(current["run"], title=title)
        return [timeline,
                settings_figure([r["row"] for r in results.values()], current=row["label"])]

    first = next(iter(results), ("90% of capacity", "continuous", None, False))
    offered = {key[2] for key in results if key[2] is not None}          # the opening's budgets too
    controls = {
        "load": widgets.Dropdown(options=list(loads), value=first[0], description="arrivals"),
        "policy": widgets.ToggleButtons(options=["static", "continuous"], value=first[1], description="policy"),
        "budget": widgets.Dropdown(options=["off"] + [str(b) for b in sorted(set(budgets) | offered)],
                                   value="off" if first[2] is None else str(first[2]), description="token budget"),
        "prefix": widgets.ToggleButtons(options=["off", "on"], value="on" if first[3] else "off",
                                        description="prefix cache"),
    }
    title = "Serving: arrival rate, policy, token budget, prefix caching"
    if not chunking:
        controls = {name: controls[name] for name in ("load", "policy")}
        title = "Serving: arrival rate and policy"
    explorer = Explorer(controls, render, title=title, use_widget=use_widget)
    holder["explorer"] = explorer
    return explorer
