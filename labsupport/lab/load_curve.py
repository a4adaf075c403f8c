"""The throughput-latency curve: one seeded workload served at rising Poisson arrival rates.

Introduced in notebook 06b (chunked prefill and prefix caching).

At a low arrival rate a server is mostly idle: each request is served almost alone,
its time to first token is one prefill and its inter-token latency one small decode
step. As the rate rises, the batch fills and throughput grows, until the server is
saturated: requests then queue, and time to first token grows without bound while
throughput stops growing. Where a configuration bends tells how much load it takes.

`load_curve` serves the same seeded requests (only their arrival times change with the
rate) with each configuration in turn at each rate, over the engine's public API only,
and returns one flat row per (configuration, rate). Rates are given as fractions of a
measured capacity (`saturation_rate`: requests per second when all arrive at once), so
the same sweep means the same thing on a laptop and on a GPU.

A busy machine serves every run several times slower: a sweep of a minute on a quiet laptop ran
past 20 minutes at a load of 9 to 14 per core. `fit_to_load` shrinks the sweep there, and says so
in one sentence; `load_curve(..., progress=True)` draws a progress bar, one step per run.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import is_dataclass, replace
from typing import Callable, Mapping, Sequence

from tqdm.auto import tqdm

from ..errors import LabError
from ..inputs import finite_number, whole_number
from ..engine.serving.engine import Engine
from .busy import LOAD_LIMIT
from .serving_metrics import percentile, summarize, time_per_output_token
from .serving_workload import arrival_times, make_workload

SHRUNK = ("requests", "slots", "median_new_tokens", "max_new_tokens", "loads")    # what fit_to_load reads of the sizes
KEYS = ("throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "prefill_tokens", "cached_tokens")


def configurations(token_budget: int) -> dict[str, dict]:
    """The engine settings a load curve compares, by name: static; continuous; continuous with
    chunked prefill under `token_budget` tokens per step; and that with prefix caching.

    Introduced in notebook 06b (chunked prefill and prefix caching). Each value is keyword arguments of `Engine`."""
    token_budget = whole_number(token_budget, "token_budget (tokens per engine step)")
    return {"static": {"policy": "static"},
            "continuous": {"policy": "continuous"},
            "chunked prefill": {"policy": "continuous", "token_budget": token_budget},
            "chunked + prefix caching": {"policy": "continuous", "token_budget": token_budget,
                                         "prefix_caching": True}}


def engine_row(result) -> dict:
    """The curve's figures of one engine run (`ServingResult`): throughput (tokens per second),
    TTFT, inter-token latency and time per output token percentiles, prompt tokens computed and
    taken from the prefix cache, and its decode path (`Engine.decode_path`). Introduced in notebook 06b (chunked prefill and prefix caching)."""
    m = summarize(result)
    return {"throughput": m["throughput_tokens_per_s"], "ttft_p50": m["ttft_p50"], "ttft_p99": m["ttft_p99"],
            "itl_p50": m["itl_p50"], "itl_p99": m["itl_p99"], "tpot_p50": m["tpot_p50"],
            "prefill_tokens": m["prefill_tokens_computed"], "cached_tokens": m["prefix_cached_tokens"],
            "decode_path": result.decode_path}


def peer_row(arrivals: Mapping, token_times: Mapping) -> dict:
    """The same figures for a peer that reports only when each token came out
    (`bench.peers.continuous_batching.hf_serve`): arrivals and token_times by request id, in seconds
    from the start. Prompt tokens are unknown (nan). Introduced in notebook 06 (continuous batching)."""
    times = {i: t for i, t in token_times.items() if t}
    if not times:
        nan = float("nan")
        return dict.fromkeys(KEYS, nan)
    start = min(arrivals[i] for i in times)
    end = max(t[-1] for t in times.values())
    tokens = sum(len(t) for t in times.values())
    ttft = [t[0] - arrivals[i] for i, t in times.items()]
    gaps = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    tpot = [v for t in times.values() if (v := time_per_output_token(t[0], t[-1], len(t))) is not None]
    return {"throughput": tokens / (end - start) if end > start else float("nan"),
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99), "tpot_p50": percentile(tpot, 50),
            "prefill_tokens": float("nan"), "cached_tokens": float("nan")}


def saturation_rate(model, requests: Sequence, max_slots: int, block_size: int = 16) -> float:
    """Requests per second our continuous engine serves when `requests` all arrive at once:
    the capacity a load curve's rates are fractions of. Introduced in notebook 06b (chunked prefill and prefix caching)."""
    at_once = [_at(r, 0.0) for r in requests]
    longest = max(r.max_length for r in at_once)
    result = Engine(model, max_slots=max_slots, block_size=block_size,
                    cache_tokens=max_slots * longest).run(at_once)
    return len(at_once) / summarize(result)["duration"]


def _at(request, arrival: float):
    """A copy of `request` arriving at `arrival` (the tokens and the length stay)."""
    return replace(request, arrival=arrival)


def at_rate(requests: Sequence, rate: float | None, seed: int = 0) -> list:
    """The same requests (prompts, lengths, sampling) arriving as a seeded Poisson process at
    `rate` requests per second; None: all at once. Introduced in notebook 06b (chunked prefill and prefix caching)."""
    return [_at(r, t) for r, t in zip(requests, arrival_times(len(requests), rate, seed))]


def fit_to_load(sizes, loads: Mapping[str, float], load: float | None,
                limit: float = LOAD_LIMIT) -> tuple[object, dict[str, float], str | None]:
    """The load curve's sizes and rates for this machine now, and a sentence when they shrank.

    Introduced in notebook 06b (chunked prefill and prefix caching). sizes: a
    `workloads.ServingSizes`; loads: name -> fraction of capacity; load: `busy.load_per_core()`
    (None: not known, nothing shrinks). Above `limit` the machine is busy and every run is slower,
    so the sweep shrinks: half the requests (at least two per slot, so that a queue still forms),
    answers half as long, and two rates only, the highest at or below capacity and the highest.
    Returns (sizes, loads, None) on a quiet machine, else the smaller ones and what shrank."""
    if not is_dataclass(sizes) or not all(hasattr(sizes, f"curve_{k}") for k in SHRUNK):
        raise LabError(f"fit_to_load takes a workloads.ServingSizes (SERVING_PRESETS['cpu'], say), "
                       f"not {type(sizes).__name__}.")
    if not isinstance(loads, Mapping) or not loads:
        raise LabError("fit_to_load needs loads as a dict of name -> fraction of capacity, at least one.")
    loads = {name: finite_number(f, f"the load {name!r} (a fraction of capacity)", minimum=0, above_minimum=True)
             for name, f in loads.items()}
    if load is None or finite_number(load, "load (the load average per core)", minimum=0) <= limit:
        return sizes, loads, None
    by_rate = sorted(loads, key=loads.get)
    names = {max((n for n in by_rate if loads[n] <= 1.0), key=loads.get, default=by_rate[0]), by_rate[-1]}
    kept = {n: loads[n] for n in by_rate if n in names}
    requests = min(sizes.curve_requests, max(2 * sizes.curve_slots, sizes.curve_requests // 2))
    longest = max(1, sizes.curve_max_new_tokens // 2)
    small = replace(sizes, curve_requests=requests, curve_max_new_tokens=longest,
                    curve_median_new_tokens=max(1, min(longest, sizes.curve_median_new_tokens // 2)),
                    curve_loads=tuple(round(100 * f) for f in kept.values()))
    note = (f"The machine is busy: its load average is {load:.1f} per core. So the load curve is smaller: "
            f"{requests} requests instead of {sizes.curve_requests}, answers of at most {longest} tokens instead "
            f"of {sizes.curve_max_new_tokens}, {len(kept)} rates instead of {len(loads)}. "
            "Re-run on a quiet machine for the whole curve.")
    return small, kept, note


class _Bar:
    """A progress bar for `load_curve`: one step per run, the run under way beside it."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, desc="load curve", unit="run", file=sys.stdout, leave=True)
        self.started = False

    def __call__(self, name: str, rate: float) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_postfix_str(f"{name} at {rate:.2f} requests/s", refresh=True)

    def close(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.set_postfix_str("done", refresh=False)
        self.bar.close()


@contextlib.contextmanager
def _progress(progress, runs: int):
    """`load_curve`'s progress argument as a function (or None); a bar ends full only when the sweep did."""
    if progress is not True:
        yield progress or None
        return
    bar = _Bar(runs)
    try:
        yield bar
    except BaseException:
        bar.bar.close()
        raise
    bar.close()


def load_curve(model, prompts: list[list[int]], rates: Sequence[float], count: int, max_slots: int,
               token_budget: int, block_size: int = 16, median_new_tokens: float = 16, sigma: float = 1.0,
               max_new_tokens: int = 256, seed: int = 0, settings: Mapping[str, dict] | None = None,
               peer: Callable[[list], dict] | None = None, runs: dict | None = None,
               progress: Callable[[str, float], None] | bool | None = None) -> list[dict]:
    """Serve one seeded workload at each Poisson arrival rate with each configuration.

    Introduced in notebook 06b (chunked prefill and prefix caching).
    prompts: token ids, reused in turn for `count` requests (answer lengths log-normal, median
    `median_new_tokens`, spread `sigma`, at most `max_new_tokens`, end-of-sequence ignored);
    rates: requests per second (wall clock), each > 0; settings: name -> `Engine` keyword
    arguments (default: `configurations(token_budget)`); peer: optional function serving a
    list of requests and returning {"arrivals", "token_times"} by request id
    (`bench.peers.continuous_batching.hf_serve`), added as the configuration "Hugging Face".
    Every configuration gets `max_slots` slots and a paged cache of `max_slots` x the longest
    request. Returns one dict per (configuration, rate): "configuration", "rate", "requests",
    "tokens" and the figures of `engine_row` (times in seconds, throughput in tokens per second).
    runs: a dict to keep every `ServingResult` in, by (configuration, rate), e.g. for a timeline.
    progress: a function called before each run with (configuration, rate), or True for a
    progress bar (tqdm), one step per run.
    """
    rates = [finite_number(r, "an arrival rate (requests per second)", minimum=0, above_minimum=True)
             for r in rates]
    if not rates:
        raise LabError("load_curve needs at least one arrival rate (requests per second).")
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise LabError(f"progress takes True (a progress bar), a function of (configuration, rate) or None, "
                       f"not {type(progress).__name__}.")
    settings = dict(configurations(token_budget) if settings is None else settings)
    base = make_workload(prompts, count=count, median_new_tokens=median_new_tokens, sigma=sigma,
                         max_new_tokens=max_new_tokens, seed=seed)
    cache_tokens = max_slots * max(r.max_length for r in base)
    tokens = sum(r.max_new_tokens for r in base)
    rows = []
    engines = {name: Engine(model, max_slots=max_slots, block_size=block_size, cache_tokens=cache_tokens, **kwargs)
               for name, kwargs in settings.items()}        # made once: a GPU engine captures its graphs here
    with _progress(progress, len(rates) * (len(engines) + (peer is not None))) as progress:
        for rate in rates:
            requests = at_rate(base, rate, seed)
            for name, engine in engines.items():
                if progress is not None:
                    progress(name, rate)
                result = engine.run(requests)                     # each run starts afresh
                rows.append({"configuration": name, "rate": rate, "requests": len(requests), "tokens": tokens,
                             **engine_row(result)})
                if runs is not None:
                    runs[name, rate] = result
            if peer is not None:
                if progress is not None:
                    progress("Hugging Face", rate)
                out = peer(requests)
                rows.append({"configuration": "Hugging Face", "rate": rate, "requests": len(requests),
                             "tokens": tokens, **peer_row(out["arrivals"], out["token_times"])})
    return rows


def near_saturation(rows: list[dict], saturation: float) -> float:
    """The rate of a load curve's `rows` closest to `saturation` from below (or the lowest
    above it): where the chunked-prefill figure is read. Introduced in notebook 06b (chunked prefill and prefix caching)."""
    rates = sorted({r["rate"] for r in rows})
    below = [r for r in rates if r <= saturation * 1.0001]
    return below[-1] if below else rates[0]


def curve_of(rows: Sequence[dict], configuration: str, key: str) -> tuple[list[float], list[float]]:
    """(rates, values of `key`) of one configuration, in order of rate: one line of the curve.
    Introduced in notebook 06b (chunked prefill and prefix caching)."""
    points = sorted((r["rate"], r[key]) for r in rows if r["configuration"] == configuration)
    return [p[0] for p in points], [p[1] for p in points]
