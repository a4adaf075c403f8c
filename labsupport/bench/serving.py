"""Notebook 06's section: static against continuous batching at equal slots, chunked prefill
and prefix caching, Hugging Face's continuous batching and vLLM as peers, a load curve, and
what the paged decode step spends where.

Introduced in notebook 06 (continuous batching); ``python -m labsupport bench --sections serving``.
Every figure is measured side by side in one run and reported as measured: a target missed
is reported with its figures, never tuned away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..claims.serving import prefill_stall
from ..lab.busy import busy_reason, load_per_core
from ..lab.measure import HF_CB_GRAPHED, NOT_GRAPHED, VLLM_GRAPHED, mark_graphed, time_side_by_side
from ..weights.loading import resolve_hf_source
from ..engine.hardware import dtype_name, pick_dtype
from ..engine.serving.engine import Engine
from ..lab.load_curve import configurations, load_curve, near_saturation, saturation_rate
from ..lab.serving_metrics import reserved_vs_used, summarize
from ..lab.serving_workload import chat_prompts, make_workload, serving_workload
from ..lab.workloads import PRESETS, SERVING_PRESETS, device_class, preset
from .core import BenchContext, reported
from .options import SectionOptions, count, counts
from .peers.continuous_batching import hf_serve, vllm_serve


def _sizes(kind: str) -> dict:
    """The serving options a device preset decides (`workloads.PRESETS`, `workloads.SERVING_PRESETS`)."""
    device, serving = PRESETS[kind], SERVING_PRESETS[kind]
    return dict(slots=device.serving_slots, requests=device.serving_requests, token_budget=serving.token_budget,
                curve_requests=serving.curve_requests, curve_slots=serving.curve_slots, curve_loads=serving.curve_loads)


@dataclass(frozen=True)
class ServingOptions(SectionOptions):
    """The serving section's options. Introduced in notebook 06 (continuous batching).

    slots: batch slots of every server (two cores saturate early: notebook 02); requests:
    requests in the long-tailed workload (`serving_workload.serving_workload`); repeats: timed
    repeats of the whole workload per server; token_budget: tokens per engine step of the
    chunked-prefill servers and of the load curve's (at least the slots of each, so that
    every running request can decode in a step); curve_requests, curve_slots: requests served
    at each rate of the load curve and its servers' slots (fewer slots than requests, so that
    a queue can form); curve_loads: its rates, in percent of the saturation rate measured in
    the run. The GPU preset: `workloads.PRESETS` and `workloads.SERVING_PRESETS`."""

    SECTION = "serving"
    slots: int = count(_sizes("cpu")["slots"])
    requests: int = count(_sizes("cpu")["requests"])
    repeats: int = count(1)
    token_budget: int = count(_sizes("cpu")["token_budget"])
    curve_requests: int = count(_sizes("cpu")["curve_requests"])
    curve_slots: int = count(_sizes("cpu")["curve_slots"])
    curve_loads: tuple[int, ...] = counts(_sizes("cpu")["curve_loads"])

    def check(self) -> None:
        slots = max(self.slots, self.curve_slots)
        if self.token_budget < slots:
            which = "slots" if self.slots >= self.curve_slots else "curve_slots"
            self.refuse(f"token_budget ({self.token_budget}) must be at least {which} ({slots}): a step decodes "
                        "one token of every running request within its budget.")
        if self.curve_slots >= self.curve_requests:
            self.refuse(f"curve_slots ({self.curve_slots}) must be fewer than curve_requests "
                        f"({self.curve_requests}), or no queue can form on the load curve.")

    @classmethod
    def gpu_sizes(cls) -> dict:
        return _sizes("gpu")

# our engine's servers in the side-by-side run (their settings: `our_servers`)
OURS = ("static", "continuous", "prefix caching", "chunked + prefix caching")


def default_slots(device) -> int:
    """Batch slots, the device's preset (`workloads.PRESETS`, ``serving_slots``): 8 on a CPU
    (two cores saturate early, notebook 02), 64 on a GPU. The requests: `workloads.serving_workload`.

    Introduced in notebook 06 (continuous batching)."""
    return preset(device).serving_slots


def our_servers(token_budget: int) -> dict[str, dict]:
    """Our engine's servers of the side-by-side run, by name: static and continuous batching,
    continuous with prefix caching, and continuous with chunked prefill (`token_budget` tokens
    per step) and prefix caching. Introduced in notebook 06 (continuous batching)."""
    settings = configurations(token_budget)
    return {"static": settings["static"], "continuous": settings["continuous"],
            "prefix caching": {"policy": "continuous", "prefix_caching": True},
            "chunked + prefix caching": settings["chunked + prefix caching"]}


def serve_side_by_side(model, hf_model, requests: list, slots: int, repeats: int = 1,
                       token_budget: int | None = None, servers: dict | None = None) -> tuple[dict, dict]:
    """Serve `requests` with each of our servers and with Hugging Face's continuous batching,
    timed side by side (`time_side_by_side`: interleaved, so a noisy moment hits all alike).

    Introduced in notebook 06 (continuous batching). Our servers: `servers` (name -> `Engine`
    keyword arguments; default: "static" and "continuous", plus `our_servers(token_budget)`
    when a token budget is given), each with `slots` slots and a paged cache of `slots` x the
    longest request. "hf": `peers.continuous_batching.hf_serve` with transformers' own defaults (its
    chunked prefill and prefix sharing) and the same slot limit; hf_model=None leaves it out.
    Returns (the `Timing` of each name, the last run of each: a `ServingResult` for ours,
    `hf_serve`'s dict for "hf").
    """
    if servers is None:
        servers = our_servers(token_budget) if token_budget else {"static": {"policy": "static"},
                                                                  "continuous": {"policy": "continuous"}}
    longest = max(r.max_length for r in requests)
    runs: dict = {}
    engines = {name: Engine(model, max_slots=slots, cache_tokens=slots * longest, **kwargs)
               for name, kwargs in servers.items()}     # made before timing: a GPU engine captures its graphs here

    def ours(name):
        def fn():
            runs[name] = engines[name].run(requests)     # each run starts afresh (an empty cache)
        return fn

    def huggingface():
        runs["hf"] = hf_serve(hf_model, requests, max_slots=slots, defaults=True, cache_tokens=slots * longest)

    fns = {name: ours(name) for name in servers}
    if hf_model is not None:
        fns["hf"] = huggingface
    timings = time_side_by_side(fns, model.device, warmup=0, repeats=repeats)
    return timings, runs


def _decode_costs(model, slots: int) -> dict | None:
    try:
        from ..lab.serving_decode_cost import decode_step_costs
    except ImportError:                                      # the engine without its decode-cost probe
        return None
    return decode_step_costs(model, batch_size=slots, context=128, steps=5)


@dataclass
class _Served:
    """The workload served side by side, and what it measured. Notebook 06 (continuous batching)."""

    requests: list
    slots: int
    longest: int                    # positions of the longest request
    timings: dict                   # name -> `Timing` of the whole workload
    runs: dict                      # name -> its last run (`serve_side_by_side`)
    load: float | None              # `load_per_core` right after the timed runs
    tokens: int                     # new tokens of the whole workload
    speed: dict                     # name -> tokens/s
    metrics: dict                   # ours: name -> `serving_metrics.summarize`
    reference: dict                 # the continuous server's tokens, request id -> tokens
    same: dict                      # name -> (requests with the reference's tokens, requests)
    memory: dict                    # `serving_metrics.reserved_vs_used` of the continuous run
    lengths: list                   # the answer lengths

    def busy(self, *names):
        """Why the machine looked busy while `names` were timed, or None. Notebook 06 (continuous batching)."""
        return busy_reason({n: self.timings[n] for n in names}, load=self.load)


def section_serving(ctx: BenchContext, options: ServingOptions) -> dict:
    """All requests arrive at once; each server runs the whole workload, side by side; then a
    load curve over Poisson arrival rates, the vLLM peer and the decode step's cost shares.

    Introduced in notebook 06 (continuous batching). Its claims:
    `claims.serving.serving_section_claims` (the speeds, metrics, the prefill stall of the
    continuous run, the load curve).
    """
    # 16 bits on a GPU (fp32 serving is no one's production setting, and vLLM's kernels want 16
    # bits), fp32 on a CPU; ours, Hugging Face's and vLLM's rows all in the same dtype
    dtype = pick_dtype(ctx.device) if ctx.device.type == "cuda" else torch.float32
    model, tok = ctx.model(dtype)
    hf = ctx.hf_model(dtype)
    slots, budget = options.slots, options.token_budget
    served = _serve(ctx, model, hf, tok, options)
    curve = _load_curve(ctx, model, tok, hf, options)
    # vLLM against our plain continuous row: prefix caching off in both, the same dtype
    vllm = vllm_serve(resolve_hf_source(ctx.model_name), served.requests, ctx.device, max_slots=slots,
                      reference=served.reference, dtype=dtype_name(dtype), prefix_caching=False)
    costs = _decode_costs(model, slots)

    figures = _figures(ctx, served, curve, vllm, budget)
    if costs is not None:
        figures.append(_decode_cost_figure(ctx, costs, served.load))
        costs = {k: v for k, v in costs.items() if k != "timings"}
    same, everyone = served.same, len(served.reference)
    return {"requests": len(served.requests), "slots": slots, "tokens": served.tokens,
            "answer_lengths": served.lengths, "token_budget": budget, "tokens_per_s": served.speed,
            "timings_s": {k: t.to_dict() for k, t in served.timings.items()}, "metrics": served.metrics,
            "same_tokens": same, "prefill_stall": prefill_stall(served.runs["continuous"]),
            "same_tokens_static_continuous": same["static"][0] == everyone,
            "same_tokens_as_hf": same["hf"][0] == everyone,
            "memory": served.memory, "load": served.load, "load_curve": curve,
            "vllm": {k: v for k, v in vllm.items() if k != "tokens"}, "decode_cost": costs, "figures": figures}


def _serve(ctx: BenchContext, model, hf, tok, options: ServingOptions) -> _Served:
    """The long-tailed workload, all arriving at once, served side by side. Notebook 06 (continuous batching)."""
    requests = serving_workload(tok, ctx.device, options.requests)
    longest = max(r.max_length for r in requests)
    timings, runs = serve_side_by_side(model, hf, requests, options.slots, options.repeats,
                                       token_budget=options.token_budget)
    load = load_per_core()
    tokens = sum(r.max_new_tokens for r in requests)
    speed = {name: tokens / t.median for name, t in timings.items()}
    metrics = {name: summarize(runs[name]) for name in OURS}
    reference = runs["continuous"].tokens()
    same = {name: (sum(runs[name].tokens().get(i) == t for i, t in reference.items()), len(reference))
            for name in OURS}
    same["hf"] = (sum(runs["hf"]["tokens"].get(i) == t for i, t in reference.items()), len(reference))
    memory = reserved_vs_used(runs["continuous"], max_length=longest)
    lengths = [r.max_new_tokens for r in requests]
    return _Served(requests, options.slots, longest, timings, runs, load, tokens, speed, metrics, reference, same,
                   memory, lengths)


def _load_curve(ctx: BenchContext, model, tok, hf, options: ServingOptions) -> dict:
    """The saturation rate, and each server at rising Poisson rates below it. Notebook 06 (continuous batching)."""
    # the load curve: the same seeded workload at rising Poisson rates, fractions of the saturation rate
    sizes = SERVING_PRESETS[device_class(ctx.device)]
    curve_prompts, curve_slots = chat_prompts(tok, options.curve_requests), options.curve_slots
    shape = dict(median_new_tokens=sizes.curve_median_new_tokens, sigma=1.0,        # the curve's answer lengths
                 max_new_tokens=sizes.curve_max_new_tokens)
    base = make_workload(curve_prompts, count=options.curve_requests, **shape)
    saturation = saturation_rate(model, base, curve_slots)
    rates = [saturation * p / 100 for p in options.curve_loads]
    peer = None
    if ctx.device.type == "cuda":                    # on a CPU, a Hugging Face curve waits out every arrival
        def peer(reqs):
            return hf_serve(hf, reqs, max_slots=curve_slots, defaults=True)
    curve = load_curve(model, curve_prompts, rates, options.curve_requests, curve_slots, options.token_budget,
                       peer=peer, **shape)
    curve_load = load_per_core()
    at = near_saturation(curve, saturation)
    return {"saturation_rate": saturation, "slots": curve_slots, "rates": rates, "rows": curve,
            "chunked_at": at, "load": curve_load}


def _figures(ctx: BenchContext, s: _Served, curve: dict, vllm: dict, budget: int) -> list[dict]:
    """Every figure but the decode cost's, marked with the paths it read. Notebook 06 (continuous batching)."""
    figures = (_batching_figures(s) + _chunked_prefill_figures(curve, budget) + _peer_figures(s, vllm, budget)
               + _static_figures(s))
    # on a GPU a figure read from a run whose decode steps were not replayed CUDA graphs is a failed
    # measurement (measure.mark_graphed); the peers graph by default (their paths say so, unverified)
    paths = {name: [s.runs[name].decode_path] for name in OURS}
    paths["hf"], paths["vllm"] = [HF_CB_GRAPHED], [VLLM_GRAPHED]
    paths["curve"] = sorted({r["decode_path"] for r in curve["rows"] if "decode_path" in r})     # ours, not the peer's
    uses = {"continuous / static": ("continuous", "static"), "prefill tokens": ("continuous", "prefix caching"),
            "time to first token p50": ("continuous", "prefix caching"), "inter-token": ("curve",),
            "throughput with / without": ("curve",), "Hugging Face": ("chunked + prefix caching", "hf"),
            "vLLM": ("continuous", "vllm"), "latency p99": ("continuous", "static"),
            "time to first token p99": ("continuous", "static"), "paged cache": ()}
    for figure in figures:
        names = next(v for k, v in uses.items() if k in figure["name"])
        mark_graphed(figure, [p for n in names for p in paths[n]], ctx.device)
    return figures


def _batching_figures(s: _Served) -> list[dict]:
    """Continuous over static batching, and what prefix caching saves. Notebook 06 (continuous batching)."""
    speed, metrics, same, lengths = s.speed, s.metrics, s.same, s.lengths
    plain, cached = metrics["continuous"], metrics["prefix caching"]
    first, second = s.requests[0].prompt, s.requests[1 % len(s.requests)].prompt
    shared = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    return [
        reported("serving: continuous / static batching throughput", speed["continuous"] / speed["static"], "x",
                 target=2.0,
                 note=f"{len(s.requests)} requests, {s.slots} slots, answer lengths {min(lengths)}-{max(lengths)} "
                      f"(median {sorted(lengths)[len(lengths) // 2]}); slot use "
                      f"{plain['slot_utilization']:.0%} vs {metrics['static']['slot_utilization']:.0%}; "
                      f"same tokens: {same['static'][0]}/{same['static'][1]}",
                 busy=s.busy("continuous", "static")),
        reported("serving: prefill tokens computed, prefix caching / without", cached["prefill_tokens_computed"]
                 / plain["prefill_tokens_computed"], "fraction", target=0.5, higher_is_better=False,
                 note=f"{cached['prefill_tokens_computed']} of {plain['prefill_tokens_computed']} prompt tokens "
                      f"computed; {cached['prefix_cached_tokens']} taken from the cache; the prompts share their "
                      f"first {shared} tokens (full blocks of 16 only are shared), requests admitted in the same "
                      "step share nothing yet"),
        reported("serving: time to first token p50, without / with prefix caching",
                 plain["ttft_p50"] / cached["ttft_p50"], "x", target=1.5,
                 note=f"{plain['ttft_p50']:.2f} s without, {cached['ttft_p50']:.2f} s with; same tokens: "
                      f"{same['prefix caching'][0]}/{same['prefix caching'][1]}",
                 busy=s.busy("continuous", "prefix caching")),
    ]


def _chunked_prefill_figures(curve: dict, budget: int) -> list[dict]:
    """Chunked prefill's inter-token latency and throughput near saturation. Notebook 06 (continuous batching)."""
    at, saturation, curve_load = curve["chunked_at"], curve["saturation_rate"], curve["load"]
    point = {r["configuration"]: r for r in curve["rows"] if r["rate"] == at}
    chunked, unchunked = point["chunked prefill"], point["continuous"]
    return [
        reported("serving: inter-token latency p99, without / with chunked prefill",
                 unchunked["itl_p99"] / chunked["itl_p99"], "x", target=1.5,
                 note=f"{unchunked['itl_p99'] * 1e3:.0f} ms without, {chunked['itl_p99'] * 1e3:.0f} ms with a "
                      f"budget of {budget} tokens, at {at:.2f} requests/s ({at / saturation:.0%} of the "
                      f"{saturation:.2f} requests/s served when all arrive at once; {curve['slots']} slots)",
                 busy=busy_reason({}, load=curve_load)),
        reported("serving: throughput with / without chunked prefill, near saturation",
                 chunked["throughput"] / unchunked["throughput"], "x", target=0.9,
                 note=f"{chunked['throughput']:.1f} vs {unchunked['throughput']:.1f} tokens/s at {at:.2f} "
                      "requests/s (target: within 10%)", busy=busy_reason({}, load=curve_load)),
    ]


def _peer_figures(s: _Served, vllm: dict, budget: int) -> list[dict]:
    """Ours against Hugging Face's continuous batching and against vLLM. Notebook 06 (continuous batching)."""
    speed, same = s.speed, s.same
    return [
        reported("serving: ours / Hugging Face continuous batching (both: chunked prefill, prefix sharing)",
                 speed["chunked + prefix caching"] / speed["hf"], "x", target=1.0,
                 note=f"budget {budget} tokens (ours), transformers' own (theirs); same tokens as HF: "
                      f"{same['hf'][0]}/{same['hf'][1]}; ours without either: "
                      f"{speed['continuous'] / speed['hf']:.2f}x", busy=s.busy("chunked + prefix caching", "hf")),
        reported("serving: ours / vLLM throughput", speed["continuous"] / vllm["tokens_per_s"]
                 if vllm["skipped"] is None else float("nan"), "x",
                 note=vllm["skipped"] or f"same tokens as vLLM: {vllm['same_tokens'][0]}/{vllm['same_tokens'][1]}"),
    ]


def _static_figures(s: _Served) -> list[dict]:
    """Static batching's tail latencies over continuous's; the paged cache's use. Notebook 06 (continuous batching)."""
    metrics, memory = s.metrics, s.memory
    plain = metrics["continuous"]
    return [
        reported("serving: latency p99, static / continuous",
                 metrics["static"]["latency_p99"] / plain["latency_p99"], "x", busy=s.busy("continuous", "static")),
        reported("serving: time to first token p99, static / continuous",
                 metrics["static"]["ttft_p99"] / plain["ttft_p99"], "x",
                 note=f"p50 {plain['ttft_p50']:.2f} s continuous vs {metrics['static']['ttft_p50']:.2f} s static",
                 busy=s.busy("continuous", "static")),
        reported("serving: paged cache peak / per-slot reservation", memory["used_bytes"] / memory["reserved_bytes"],
                 "fraction", note=f"{memory['used_bytes'] / 2**20:.1f} MiB used vs "
                                  f"{memory['reserved_bytes'] / 2**20:.1f} MiB reserved for {s.slots} x {s.longest} "
                                  f"positions"),
    ]


def _decode_cost_figure(ctx: BenchContext, costs: dict, load: float | None) -> dict:
    """The paged decode step's share spent gathering the cache. Notebook 06 (continuous batching)."""
    figure = reported("serving: decode step, share of the gather", costs["gather_share"], "fraction",
                      note=f"block tables {costs['table_build_share']:.0%}, the rest "
                           f"{costs['rest_share']:.0%}; {costs['batch_size']} rows of "
                           f"{costs['context']} positions; attention over the pool: "
                           f"{costs['step_s'] / costs['pool_step_s']:.2f}x the gathering step's speed",
                      busy=busy_reason(costs["timings"], load=load))
    return mark_graphed(figure, [NOT_GRAPHED], ctx.device)      # its parts are timed one by one, eagerly
