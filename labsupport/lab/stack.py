"""Putting it together: every technique of the course stacked on one workload.

Introduced in notebook 07 (putting it together).

One workload (chat requests with long-tailed answer lengths, end-of-sequence
ignored so that every stage produces the same number of tokens:
`workloads.stack_workload`) is served by a ladder of configurations, each adding
one technique to the stage before it:

    naive loop -> + KV cache -> + static batching -> + bf16 -> + int4 weights -> + continuous batching
                       |
                       +-> + int4, batch 1 -> + speculative decoding

Each stage is compared with the stage it builds on (`builds_on`), and that chain is
fixed in advance, whatever the timings say: a stage that does not pay on this
hardware is still measured and shown (its row is not ``kept``), and the next stage
builds on it all the same. Speculative decoding runs one request at a time, so it
cannot stack on batching: it is measured against the same int4 model also run one
request at a time (a separate line from the KV-cache stage), so that both sides of its
gain run at batch 1; continuous batching builds on the batched int4 stage. The same
separate line tells how much reading fewer bytes per weight gains at batch 1 against
batched (`claims.stack`). The 16-bit stage is bf16 (fp16 on a GPU without bf16);
without a native 16-bit type it is left out and int4 builds on static batching. All
stages are timed side by side in one run (`measure.time_side_by_side`). The fastest
stage that paid is the ``best``, finally compared with Hugging Face `generate()`, one
request at a time, in fp32: the way most people first run a model (a peer stage,
`bench.peers.huggingface.hf_stack_stage`). Each row also counts the memory its configuration holds
(weights and KV cache: `best_under_budget` picks a stage for a memory budget) and,
given evaluation tokens, its teacher-forced top-1 agreement with fp32
(`quality.top1_agreement`). The chapter's claims against this run are
`claims.stack_claims`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .busy import load_per_core
from ..errors import LabError
from ..engine.generation import generate, generate_naive
from ..engine.hardware import bf16_supported
from ..engine.kv_cache import kv_cache_bytes
from ..engine.speculative import SpeculativeStats
from .measure import NOT_GRAPHED, require_graphed, time_side_by_side, timed_compile, ungraphed_paths
from .quality import top1_agreement
from .variants import ModelVariants


@dataclass
class Stage:
    """One rung of the ladder: how it serves the workload, and what it builds on.
    Notebook 07 (putting it together)."""

    name: str
    technique: str
    run: object = field(repr=False)            # () -> {request_id: tokens}
    builds_on: str | None = None
    precision: str = "fp32"
    note: str = ""
    variant: tuple[str, str] | None = None     # (precision, weights) of its `ModelVariants` model; None for a peer
    cached_sequences: int = 0                  # sequences whose KV cache it holds at once (0: no cache)
    decode_paths: set = field(default_factory=set, repr=False)   # what its steps ran on (`serve_fn`)
    speculation: SpeculativeStats | None = field(default=None, repr=False)   # its drafts' stats, summed (`serve_fn`)
    draft_k: int | None = None                 # the draft length of a speculative stage


def low_precision(device) -> tuple[torch.dtype | None, str]:
    """The 16-bit type this device computes natively, or None and the reason.
    Notebook 07 (putting it together)."""
    if bf16_supported(device):
        return torch.bfloat16, "bf16"
    if torch.device(device).type == "cuda":
        return torch.float16, "fp16"                     # a T4: fp16 tensor cores, no bf16
    return None, "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), so 16-bit would be emulated"


BATCHING = ("none", "static", "continuous")
HF_PEER = "Hugging Face generate()"          # the peer the best stage is compared with (`run_stack`)
INT4_BATCH_1 = "+ int4, batch 1"             # the int4 model one request at a time: speculation's base


def serve_fn(variants: ModelVariants, requests, kv_cache: bool = True, batching: str = "none",
             precision: str = "fp32", weights: str = "float", speculative: bool = False,
             slots: int = 8, draft_k: int = 4, paths: set | None = None, speculation: SpeculativeStats | None = None):
    """A function that serves every request with one combination of the techniques and
    returns {request_id: tokens}. Notebook 07's explorer turns these switches.

    paths: a set to which each call adds the decode path its steps took
    (`GenerationResult.decode_path`: "eager", "compiled", "compiled + CUDA graphs"). On a GPU
    `generate` and speculative decoding (its verify passes) run replayed CUDA graphs
    (`measure.timed_compile`), else a LabError (`measure.require_graphed`); the serving engine
    and the chapter's loop without a cache run their own step loops: on a GPU they say
    "eager (not graphed)", and `run_stack` marks their rows as not graphed measurements.
    speculation: a `SpeculativeStats` to which speculative decoding adds each call's stats
    (`SpeculativeStats.add`); notebook 07's cost model reads the acceptance rate alpha off them.

    Without the cache only the chapter's loop exists (one request at a time); speculative
    decoding runs one request at a time (with the cache), so it excludes batching.
    """
    if batching not in BATCHING:
        raise LabError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}.")
    if not kv_cache and (batching != "none" or speculative):
        raise LabError("Batching and speculative decoding both need the KV cache here; turn the cache on.")
    if speculative and batching != "none":
        raise LabError("Speculative decoding runs one request at a time here; set batching to none.")
    model = variants.get(precision, weights)
    paths = set() if paths is None else paths
    graphed = timed_compile(model.device)
    own_loop = NOT_GRAPHED if graphed else "eager"      # the naive loop, the engine: their own eager loops

    def own(result):
        paths.add(own_loop)
        return result

    def graphed_path(result, what="generate()"):
        result = require_graphed(result, f"the stage's {what} ({precision}, {weights})", model.device)
        paths.add(getattr(result, "decode_path", "eager"))
        return result

    def one_at_a_time(fn):
        return lambda: {r.request_id: fn(r) for r in requests}

    if not kv_cache:
        return one_at_a_time(lambda r: own(generate_naive(model, r.prompt, r.max_new_tokens, eos_token_ids=())).row(0))
    if speculative:
        return one_at_a_time(_speculate(model, draft_k, graphed, graphed_path, speculation))
    if batching == "none":
        return one_at_a_time(lambda r: graphed_path(generate(model, r.prompt, r.max_new_tokens, eos_token_ids=(),
                                                             compile=graphed)).row(0))
    if batching == "continuous":
        return _continuous(model, requests, slots, paths, own_loop)
    return _static_batches(model, requests, slots, graphed, graphed_path)


def _speculate(model, draft_k: int, graphed: bool, graphed_path, speculation: SpeculativeStats | None):
    """Serve one request by speculative decoding, its drafts' stats added up. Notebook 07 (putting it together)."""
    from ..engine.speculative import PromptLookupDraft, speculative_generate   # looked up per call: tests spy on it
    lookup = PromptLookupDraft(ngram=3)
    summed = SpeculativeStats() if speculation is None else speculation

    def speculate(r):
        result = graphed_path(speculative_generate(model, lookup, r.prompt, r.max_new_tokens, k=draft_k,
                                                   eos_token_ids=(), compile=graphed), "speculative decoding")
        summed.add(result.stats)
        return result.tokens
    return speculate


def _continuous(model, requests, slots: int, paths: set, own_loop: str):
    """Serve every request with the serving engine's continuous batching. Notebook 07 (putting it together)."""
    from ..engine.serving.engine import Engine
    longest = max(r.max_length for r in requests)

    def continuous():
        paths.add(own_loop)                                  # the engine's own step loop
        return Engine(model, max_slots=slots, policy="continuous",
                      cache_tokens=slots * longest).run(requests).tokens()
    return continuous


def _static_batches(model, requests, slots: int, graphed: bool, graphed_path):
    """Serve the requests in padded batches of `slots`, one `generate` each. Notebook 07 (putting it together)."""

    def static_batches():
        # padded batches; each runs until its longest answer ends (finished rows keep computing)
        out = {}
        for i in range(0, len(requests), slots):
            batch = requests[i:i + slots]
            result = graphed_path(generate(model, [r.prompt for r in batch], max(r.max_new_tokens for r in batch),
                                           eos_token_ids=(), compile=graphed))
            for row, r in enumerate(batch):
                out[r.request_id] = result.tokens[row, : r.max_new_tokens].tolist()
        return out
    return static_batches


def build_stages(model, requests, slots: int = 8, draft_k: int = 4,
                 variants: ModelVariants | None = None) -> list[Stage]:
    """The ladder for `model` (fp32) on this device. Introduced in notebook 07."""
    variants = variants or ModelVariants(model)
    dtype, precision = low_precision(model.device)
    half = precision if dtype is not None else "fp32"

    def stage(name, technique, builds_on=None, note="", **switches):
        switches.setdefault("precision", "fp32")
        weights = switches.get("weights", "float")
        label = switches["precision"] + ("" if weights == "float" else f" + {weights}")
        cached = 0 if not switches.get("kv_cache", True) else (
            1 if switches.get("batching", "none") == "none" else slots)
        paths: set = set()
        summed = SpeculativeStats() if switches.get("speculative") else None
        return Stage(name, technique, serve_fn(variants, requests, slots=slots, draft_k=draft_k, paths=paths,
                                               speculation=summed, **switches),
                     builds_on, label, note, (switches["precision"], weights), cached, paths, summed,
                     draft_k if summed is not None else None)

    stages = [
        stage("naive loop", "the chapter's loop: no cache, one request at a time", kv_cache=False),
        stage("+ KV cache", "KV cache (notebook 01)", "naive loop"),
        stage("+ static batching", f"padded batches of {slots} (notebook 02)", "+ KV cache", batching="static"),
    ]
    previous, note = "+ static batching", ""
    if dtype is not None:
        stages.append(stage(f"+ {precision}", f"{precision} weights and activations (notebook 03)", previous,
                            batching="static", precision=precision))
        previous = f"+ {precision}"
    else:
        note = f"16-bit skipped: {precision}"
    int4 = dict(precision=half, weights="int4")
    kernels = ", ".join(f"{n} {k}" for k, n in variants.handle(**int4).kernels.items())
    stages += [
        stage("+ int4 weights", f"int4 weights, groups of 32 (notebook 04); kernels: {kernels}", previous, note,
              batching="static", **int4),
        stage(INT4_BATCH_1, "the int4 stage's model, one request at a time: the batch-1 base of speculation",
              "+ KV cache", **int4),
        stage("+ speculative decoding", f"prompt lookup, k = {draft_k} (notebook 05), one request at a time",
              INT4_BATCH_1, speculative=True, **int4),
        stage("+ continuous batching", f"{slots} slots, paged KV cache (notebook 06)", "+ int4 weights",
              batching="continuous", **int4),
    ]
    return stages


def _count_weight_passes(stages, variants: ModelVariants):
    """Count, per stage, the forward passes of its model (each reads every weight once): a
    forward hook on each served model, the one entrance of every pass. Returns
    (passes: {stage: count}, set_current(stage name), remove())."""
    passes, current, handles = {}, [None], []
    served = {id(m): m for m in (variants.get(*s.variant) for s in stages if s.variant is not None)}

    def count(*_):
        passes[current[0]] = passes.get(current[0], 0) + 1
    for m in served.values():
        handles.append(m.register_forward_hook(count))
    return passes, lambda name: current.__setitem__(0, name), lambda: [h.remove() for h in handles]


def _speculation(stats: SpeculativeStats | None, k: int | None) -> dict | None:
    """A speculative stage's draft length k and what its drafts did, summed over its runs: alpha
    (`SpeculativeStats.alpha`, the alpha of `speculative_math.expected_tokens_per_call`; 0 when no
    draft was checked), drafted and kept tokens per target pass. None for the other stages (and
    before any target pass)."""
    if stats is None or not stats.target_calls:
        return None
    return {"k": k, "alpha": stats.alpha if stats.accepted + stats.rejected else 0.0,
            "drafted_per_pass": stats.drafted / stats.target_calls, "tokens_per_pass": stats.tokens_per_call}


def run_stack(model, requests, slots: int = 8, peers=(), repeats: int = 1, progress=None,
              variants: ModelVariants | None = None, agreement_tokens=None, bandwidth: float | None = None) -> dict:
    """Time every stage side by side; returns one row per stage with its tokens/s, its gain
    over the stage it builds on, its gain over the naive loop, how many of its generated
    tokens equal the fp32 reference (the KV-cache stage), and the memory it holds.

    Introduced in notebook 07 (putting it together). peers: extra `Stage`s timed with the
    ladder but not on it, e.g. Hugging Face generate() (`bench.peers.huggingface.hf_stack_stage`); a
    peer named `HF_PEER` gives ``stack_vs_hf``, the best stage's tokens/s over the peer's.
    variants: the `ModelVariants` of `model` to build the stages from (default: a new one).
    agreement_tokens: token ids (e.g. `quality.eval_tokens`) on which each stage's model
    is compared with fp32, teacher-forced (``top1_agreement``: the fraction of positions where
    both predict the same next token); without them that column is None. Generated tokens
    compared one by one (``same_tokens_as_fp32``) drift apart after the first changed token,
    so they only prove that the fp32 stages are exact. Each row also holds its ``timing``
    (`measure.Timing.to_dict`), and the result the machine's ``load`` per core right after
    the timings (`busy.load_per_core`), so that verdicts can say when the machine was busy.
    Each stage with a model also counts its forward passes per run (``weight_passes``: every
    pass reads every weight once); with the machine's `bandwidth` (bytes/s, `roofs.probe`)
    its ``bandwidth_fraction`` is weight bytes x passes per second / bandwidth: how close the
    stage runs to the memory roof, and what a technique removed (fewer bytes per pass, or
    fewer passes per token). The speculative stage's ``speculation`` says what its drafts did
    (`_speculation`: k, alpha, drafted and kept tokens per target pass); None elsewhere.
    """
    if not requests:
        raise LabError("run_stack needs at least one request.")
    variants = variants or ModelVariants(model)
    stages = build_stages(model, requests, slots, variants=variants) + list(peers)
    timings, outputs, passes, runs = _time_stages(stages, variants, model.device, repeats, progress)
    load = load_per_core()
    tokens = sum(r.max_new_tokens for r in requests)
    reference = outputs["+ KV cache"]
    speed = {name: tokens / t.median for name, t in timings.items()}
    longest = max(r.max_length for r in requests)
    agreement: dict = {}
    rows, best = [], None
    for stage in stages:
        out = outputs[stage.name]
        same = sum(a == b for r in requests for a, b in zip(out[r.request_id], reference[r.request_id]))
        row = _stage_row(stage, timings[stage.name], speed, same / tokens)
        if stage.variant is not None:
            _count_model(row, stage, model, variants, passes.get(stage.name, 0) / runs[stage.name], bandwidth,
                         longest, agreement_tokens, agreement)
        row["kept"] = stage.builds_on is not None and row["gain"] > 1.0
        rows.append(row)
        if row["kept"] and stage.name != HF_PEER:
            best = row if best is None or row["tokens_per_s"] > best["tokens_per_s"] else best
    result = {"requests": len(requests), "tokens": tokens, "slots": slots, "device": str(model.device),
              "stages": rows, "best": best["stage"] if best else None, "load": load}
    if HF_PEER in speed and best is not None:
        result["stack_vs_hf"] = best["tokens_per_s"] / speed[HF_PEER]
    return result


def _time_stages(stages, variants: ModelVariants, device, repeats: int, progress):
    """Time the stages side by side: (timings, outputs, passes, runs). Notebook 07 (putting it together)."""
    for stage in stages:                      # counts from the timed runs only
        if stage.speculation is not None:
            stage.speculation.__init__()         # back to zero, in place: its `serve_fn` holds it
    outputs: dict = {}
    passes, set_current, remove_hooks = _count_weight_passes(stages, variants)
    runs = dict.fromkeys((s.name for s in stages), 0)      # warm-up calls included, as in passes

    def timed(stage):
        def fn():
            if progress is not None:
                progress(stage.name)
            set_current(stage.name)
            runs[stage.name] += 1
            outputs[stage.name] = stage.run()
        return fn

    try:
        timings = time_side_by_side({s.name: timed(s) for s in stages}, device, warmup=0, repeats=repeats)
    finally:
        remove_hooks()
    return timings, outputs, passes, runs


def _stage_row(stage: Stage, timing, speed: dict, same: float) -> dict:
    """A stage's row: its speed, gains, tokens and decode paths. Notebook 07 (putting it together)."""
    row = {"stage": stage.name, "technique": stage.technique, "precision": stage.precision,
           "tokens_per_s": speed[stage.name], "seconds": timing.median,
           "timing": timing.to_dict(), "builds_on": stage.builds_on, "note": stage.note,
           "gain": speed[stage.name] / speed[stage.builds_on] if stage.builds_on else None,
           "cumulative": speed[stage.name] / speed["naive loop"], "same_tokens_as_fp32": same, "top1_agreement": None,
           "weight_bytes": None, "kv_cache_bytes": None, "weight_passes": None, "bandwidth_fraction": None,
           "batch_rows": None, "speculation": _speculation(stage.speculation, stage.draft_k),
           "decode_path": ", ".join(sorted(stage.decode_paths)) or None, "decode_paths": sorted(stage.decode_paths),
           "graphed": None if not ungraphed_paths(stage.decode_paths) else False}
    if row["graphed"] is False:     # on a GPU: never passes silently as a graphed figure
        row["note"] = (row["note"] + " " if row["note"] else "") + ("Not a graphed measurement: its step loop "
                                                                   "ran without CUDA graphs, kernel launches included.")
    return row


def _count_model(row, stage: Stage, model, variants, weight_passes, bandwidth, longest, agreement_tokens, agreement):
    """Add to a stage's row what its model holds and reads. Notebook 07 (putting it together)."""
    served = variants.get(*stage.variant)
    row["weight_bytes"] = served.weight_bytes()
    row["weight_passes"] = weight_passes
    row["batch_rows"] = max(1, stage.cached_sequences)         # sequences sharing each pass
    if bandwidth:
        row["bandwidth_fraction"] = row["weight_bytes"] * row["weight_passes"] / row["seconds"] / bandwidth
    row["kv_cache_bytes"] = kv_cache_bytes(served.config, longest, stage.cached_sequences, served.dtype)
    if agreement_tokens is not None:
        if stage.variant not in agreement:
            agreement[stage.variant] = (1.0 if served is model else
                                        top1_agreement(model, served, agreement_tokens))
        row["top1_agreement"] = agreement[stage.variant]


def removed_work(result: dict) -> list[dict]:
    """What each stage removed from the stage it builds on, from `run_stack`'s counts: bytes
    of weights per forward pass (precision, quantization), forward passes per generated
    token (the KV cache does not remove passes but makes each one cheap; batching and
    speculation remove passes), and the time gain those bought.

    Introduced in notebook 07 (putting it together). One row per stage with a model and a
    `builds_on`: stage, builds_on, bytes_per_pass (this stage's / its base's),
    passes_per_token (likewise), gain, bandwidth_fraction (None without a bandwidth).
    """
    rows = {r["stage"]: r for r in result["stages"]}
    tokens = result["tokens"]
    out = []
    for row in result["stages"]:
        base = rows.get(row["builds_on"])
        if base is None or row["weight_passes"] is None or base["weight_passes"] is None:
            continue
        out.append({"stage": row["stage"], "builds_on": base["stage"],
                    "bytes_per_pass": row["weight_bytes"] / base["weight_bytes"],
                    "passes_per_token": (row["weight_passes"] / tokens) / (base["weight_passes"] / tokens),
                    "gain": row["gain"], "bandwidth_fraction": row["bandwidth_fraction"]})
    return out


def best_under_budget(rows: list[dict], budget_bytes: float) -> str | None:
    """The fastest stage whose weights and KV cache fit in `budget_bytes`, or None if none fits.

    Introduced in notebook 07 (putting it together), its exercise 3. rows: `run_stack`'s
    rows (a stage's memory is ``weight_bytes + kv_cache_bytes``; rows without them, the
    peers, are skipped). Stages are compared by tokens/s, not by ``gain``: each gain is over
    a different stage.
    """
    fitting = [r for r in rows if r.get("weight_bytes") is not None
               and r["weight_bytes"] + r["kv_cache_bytes"] <= budget_bytes]
    return max(fitting, key=lambda r: r["tokens_per_s"])["stage"] if fitting else None

