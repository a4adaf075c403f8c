"""Notebook 00's peer table: labsupport beside every engine a learner could pick instead.

Introduced in notebook 00 (where the time goes); ``python -m labsupport bench --sections engines``.

One prompt, greedy, batch 1, exactly `new_tokens` tokens (end-of-sequence ignored), every
engine timed in the same interleaved rounds (`measure.time_side_by_side`):

* labsupport fp32, eagerly and with its decode step compiled (`generate(compile=True)`; on a
  GPU compiled + CUDA graphs only, see below);
* labsupport int4, groups of 32 (notebook 04), the row to set beside llama.cpp: its default
  kernel (on a CPU where it builds, our W4A8 kernel, which multiplies int4 weights by int8
  activations as llama.cpp does), and the same weights through aten's bf16 kernel, as before;
* labsupport int4 with its decode step compiled, beside the eager row's one C++ call per layer
  (`fused.decode_block`, issue 40: before it, half of an eager int4 step was Python and dispatch);
* labsupport int8 (absmax per row, aten's fused kernel);
* Hugging Face generate() with its dynamic cache; its documented fast path (the static
  cache with torch.compile); its prompt-lookup decoding; its assisted generation with a
  draft made of the model's own first layers;
* llama.cpp on the embedded model's own Q4_1 GGUF file with the same thread count
  (an optional extra: where it is missing, its row says why).

Where llama.cpp runs, two more int4 figures are timed against it, side by side: the prefill of a
512-token prompt, and the decode of 8 sequences at once, for new_tokens // 2 tokens (`engines_int4.py`).

Prefill and decode are reported apart: each engine is also timed producing one token
(its prefill), and its decode speed is (new_tokens - 1) / (whole run - prefill). A
memory copy (several copies per sample, so its repeats agree) and a read of the same buffer (a sum:
nothing written, as a decode step writes almost nothing) are timed in the same rounds, so every
row's fractions of bandwidth (bytes a decode step reads, `weight_bytes` with the output head and
without the embedding rows it skips, plus the KV cache at its mean length, x decode steps per
second / each probe's bandwidth) divide by bandwidths measured at the same moments (issue 54: the
read probe is the limit; targets fp32 >= 90% and int4 >= 70% of it). On a CPU each row also gives the
weight bytes it read per second per core: llama.cpp on 2 threads is bound by its cores, not by
memory, so that is the yardstick of a CPU engine (issue 40). Compile times are timed apart, on each engine's first call.

On a GPU every row is timed as a replayed CUDA graph (`measure.timed_compile`): labsupport's
rows compiled + CUDA graphs (so the separate compiled rows are absent), Hugging Face's row its
static cache + torch.compile (mode "reduce-overhead"). Each row says its decode path; a row
that could not be graphed (prompt lookup, assisted generation) gives failed figures there
(`measure.mark_graphed`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace

import torch

from ..errors import LabError
from ..lab.busy import busy_reason
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..engine.kv_cache import kv_cache_bytes
from ..engine.quant import quantize_model
from ..lab.measure import (NOT_GRAPHED, WARMUP_TOKENS, mark_graphed, require_graphed,
                           time_side_by_side, timed_compile)
from ..weights.embedded import find_gguf
from ..lab.quality import quantized_bytes
from ..lab.roofs import copy_bandwidth, copy_timing, read_bandwidth
from ..lab.workloads import DEFAULT_PROMPT
from .core import BenchContext, GraphCount, reported
from .peers.llamacpp import LlamaCppGreedy, llamacpp_unavailable
from .engines_int4 import (BATCH_ROWS, LLAMACPP, OURS_INT4, batched_figures, decode_knee, knee_figures,
                            long_prefill, long_prefill_figures)
from .options import SectionOptions, count, switch
from .peers.huggingface import hf_assisted_fn, hf_early_layers_draft, hf_generate_fn, hf_static_compiled_fn

OURS, OURS_COMPILED = "labsupport fp32", "labsupport fp32, compiled"
OURS_INT4_ATEN, OURS_INT8 = "labsupport int4 g32, aten kernel", "labsupport int8"
OURS_INT4_COMPILED = "labsupport int4 g32, compiled"
HF, HF_STATIC, HF_LOOKUP, HF_ASSISTED = ("HF generate() fp32", "HF static cache + torch.compile",
                                         "HF prompt lookup", "HF assisted generation")
COPY, READ = "memory copy", "memory read"
# One sample of the copy probe is several copies back to back. A single copy timed right after a
# decode run spread 30-50% between repeats even on a quiet machine (issue 40), which withheld every
# verdict as "busy"; a few copies per sample average out what the previous run left in the caches.
COPIES_PER_SAMPLE = 4
INT4_TARGET = 1.0           # int4 decode at least llama.cpp's on the same file and cores (issue 40; 0.8 before)
READ_TARGETS = {OURS: 0.9, OURS_INT4: 0.7}           # decode's fraction of the read probe (issue 54)


@dataclass(frozen=True)
class EnginesOptions(SectionOptions):
    """The engines section's options (the same on a CPU and a GPU). Introduced in notebook 00.

    new_tokens: new tokens per generate() call (greedy, batch 1); repeats: timed repeats of
    every engine, interleaved; llamacpp: time llama.cpp where llama-cpp-python is installed
    (the `peers` extra). The rows that only cost time are off by default, one switch away
    (`with_all_peers`, ``--all-peers``): compile: the compiled rows (labsupport's compiled
    decode, Hugging Face's static cache + torch.compile; each compiles on its first call,
    minutes on a 2-core CPU); lookup: tokens Hugging Face's prompt-lookup row drafts per step
    (0: no such row); draft_layers: first layers of the model kept as the draft of its
    assisted-generation row (0: no such row; on the course's prompt its drafts are almost
    never accepted, so it measures the cost of drafting)."""

    SECTION = "engines"
    new_tokens: int = count(128)
    repeats: int = count(5)     # 4 or more: the spread is the interquartile range, one outlier withholds no verdict
    compile: bool = switch(False)
    llamacpp: bool = switch(True)
    lookup: int = count(0, minimum=0)
    draft_layers: int = count(0, minimum=0)

    def with_all_peers(self) -> "EnginesOptions":
        """These options with every slow row on: compiled rows, prompt lookup (10 tokens) and
        assisted generation (a 10-layer draft). Notebook 00; ``--all-peers``."""
        return replace(self, compile=True, lookup=self.lookup or 10, draft_layers=self.draft_layers or 10)


GRAPHED_ALREADY = "on a GPU every labsupport row is already compiled + CUDA graphs (measure.timed_compile)"


@dataclass
class _Rows:
    """The rows as gathered: runs, why absent, compile seconds, kernels. Notebook 00 (where the time goes)."""

    ids: list[int]
    device: torch.device
    graphed: bool
    paths: dict                                    # name -> the decode paths its calls took
    engines: dict = field(default_factory=dict)    # name -> (run(n) -> new token ids, weight bytes per step)
    absent: dict = field(default_factory=dict)     # name -> why it is absent
    compile_s: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    ours_rows: list = field(default_factory=list)

    def ours(self, m, name, compiled=False):
        """Row `name`'s run(n): our `m`, its paths and compile seconds kept. Notebook 00 (where the time goes)."""
        self.ours_rows.append(name)

        def run(n):
            result = generate(m, self.ids, n, eos_token_ids=(), compile=compiled or self.graphed)
            self.paths.setdefault(name, set()).add(result.decode_path)
            if self.graphed:                            # compiling and recording: reported apart
                self.compile_s[name] = self.compile_s.get(name, 0.0) + result.warmup_seconds
            return require_graphed(result, name, self.device).row(0)
        return run

    def theirs(self, make, name, path, graph_count: GraphCount | None = None):
        """run(n) of a peer's generate() closure `make(n)` as row `name`, its decode path `path`;
        with a `graph_count`, each closure's first (compiling) call is counted and the path is what
        torch's counts say (`GraphCount.hf_path`). Notebook 00 (where the time goes)."""
        runs = {}                                 # one generate() closure per token count

        def run(n):
            if n not in runs:
                runs[n] = make(n) if graph_count is None else graph_count.first_call(make(n))
            if graph_count is None:
                self.paths.setdefault(name, set()).add(path)
            tokens = runs[n]()[0, len(self.ids):].tolist()
            if graph_count is not None:
                self.paths[name] = {graph_count.hf_path(graphed=True)}
            return tokens
        return run


def _engines(ctx: BenchContext, options: EnginesOptions, ids: list[int],
             paths: dict | None = None) -> tuple[dict, dict, dict, dict]:
    """name -> (run(n) -> new token ids, weight bytes a decode step reads); name -> why it is
    absent; name -> seconds its first call spent compiling; name -> the kernel its layers run
    (quantized rows). paths: a dict filled with name -> the decode paths its calls took."""
    model, _ = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    rows = _Rows(ids, ctx.device, timed_compile(ctx.device), {} if paths is None else paths)
    _our_rows(rows, ctx, model, options)
    _hf_rows(rows, hf, model.weight_bytes(), options)
    if rows.graphed:      # each row's first call compiles and records it; one that cannot be graphed fails alone
        _record_graphs(rows, options.new_tokens)
    _llamacpp_row(rows, ctx, options)
    return rows.engines, rows.absent, rows.compile_s, rows.kernels


def _our_rows(rows: _Rows, ctx: BenchContext, model, options: EnginesOptions) -> None:
    """Our rows: fp32, int4 (also via aten's kernel), int8, compiled if asked. Notebook 00 (where the time goes)."""
    rows.engines[OURS] = (rows.ours(model, OURS), model.weight_bytes())
    _compiled_row(rows, model, OURS_COMPILED, model.weight_bytes(), options)
    int4 = ctx.variants.get("float32", "int4", group_size=32)          # the run's int4 variant
    rows.engines[OURS_INT4] = (rows.ours(int4, OURS_INT4), quantized_bytes(int4))
    rows.kernels[OURS_INT4] = ctx.variants.handle("float32", "int4", group_size=32).describe()
    # inductor's fusion against our one call per layer
    if _compiled_row(rows, int4, OURS_INT4_COMPILED, quantized_bytes(int4), options):
        rows.kernels[OURS_INT4_COMPILED] = rows.kernels[OURS_INT4]
    if "W4A8" in rows.kernels[OURS_INT4]:               # the same weights through the kernel it replaced
        aten_int4 = copy.deepcopy(model)
        rows.kernels[OURS_INT4_ATEN] = quantize_model(aten_int4, "int4", group_size=32, kernel="fast").describe()
        rows.engines[OURS_INT4_ATEN] = (rows.ours(aten_int4, OURS_INT4_ATEN), quantized_bytes(aten_int4))
    else:
        rows.absent[OURS_INT4_ATEN] = f"the int4 row already runs it ({rows.kernels[OURS_INT4]})"
    rows.engines[OURS_INT8] = (rows.ours(ctx.variants.get("float32", "int8"), OURS_INT8),
                               quantized_bytes(ctx.variants.get("float32", "int8")))
    rows.kernels[OURS_INT8] = ctx.variants.handle("float32", "int8").describe()


def _compiled_row(rows: _Rows, m, name: str, weight_bytes: int, options: EnginesOptions) -> bool:
    """Row `name`: `m` with its decode step compiled (True), or why not (False). Notebook 00 (where the time goes)."""
    if rows.graphed:
        rows.absent[name] = GRAPHED_ALREADY
    elif options.compile:
        warm = generate(m, rows.ids, options.new_tokens, eos_token_ids=(), compile=True)
        if warm.decode_path != "eager":
            rows.compile_s[name] = warm.warmup_seconds
            rows.engines[name] = (rows.ours(m, name, compiled=True), weight_bytes)
            return True
        rows.absent[name] = warm.decode_note
    else:
        rows.absent[name] = "switched off (engines.compile=False; --all-peers turns it on)"
    return False


def _hf_rows(rows: _Rows, hf, weight_bytes: int, options: EnginesOptions) -> None:
    """Hugging Face's rows: generate(), static cache, prompt lookup, assisted. Notebook 00 (where the time goes)."""
    ids = rows.ids
    if rows.graphed:                                    # on a GPU HF's row is its graphed fast path
        rows.engines[HF] = (_hf_static(rows, hf, HF, options.new_tokens), weight_bytes)
        rows.absent[HF_STATIC] = f"on a GPU the {HF} row is already its static cache + torch.compile"
    else:
        rows.engines[HF] = (rows.theirs(lambda n: hf_generate_fn(hf, ids, n), HF, "eager"), weight_bytes)
        if options.compile:
            rows.engines[HF_STATIC] = (_hf_static(rows, hf, HF_STATIC, options.new_tokens), weight_bytes)
        else:
            rows.absent[HF_STATIC] = "switched off (engines.compile=False; --all-peers turns it on)"
    if options.lookup:
        rows.engines[HF_LOOKUP] = (rows.theirs(lambda n: hf_generate_fn(hf, ids, n, prompt_lookup=options.lookup),
                                               HF_LOOKUP, NOT_GRAPHED if rows.graphed else "eager"), weight_bytes)
    else:
        rows.absent[HF_LOOKUP] = "switched off (engines.lookup=0; --all-peers turns it on)"
    if options.draft_layers:
        draft = hf_early_layers_draft(hf, options.draft_layers)
        rows.engines[HF_ASSISTED] = (rows.theirs(lambda n: hf_assisted_fn(hf, draft, ids, n), HF_ASSISTED,
                                                 NOT_GRAPHED if rows.graphed else "eager"), weight_bytes)
    else:
        rows.absent[HF_ASSISTED] = "switched off (engines.draft_layers=0; --all-peers turns it on)"


def _hf_static(rows: _Rows, hf, name: str, new_tokens: int):
    """HF's static cache + torch.compile; its first call compiles, timed apart. On a GPU its path is
    what torch counted around that call (`GraphCount`), not what was asked. Notebook 00 (where the time goes)."""
    static = rows.theirs(lambda n: hf_static_compiled_fn(hf, rows.ids, n), name, "static cache + torch.compile",
                         GraphCount() if rows.graphed else None)
    start = time.perf_counter()
    static(new_tokens)
    first = time.perf_counter() - start
    start = time.perf_counter()
    static(new_tokens)
    rows.compile_s[name] = max(0.0, first - (time.perf_counter() - start))
    return static


def _record_graphs(rows: _Rows, new_tokens: int) -> None:
    """Run each of our rows once to compile and record it; drop any that fails. Notebook 00 (where the time goes)."""
    for name in rows.ours_rows:
        try:
            rows.engines[name][0](new_tokens)
        except LabError as error:
            del rows.engines[name]
            rows.absent[name] = str(error)


def _llamacpp_row(rows: _Rows, ctx: BenchContext, options: EnginesOptions) -> None:
    """llama.cpp on the model's own GGUF file and the same threads, or why not. Notebook 00 (where the time goes)."""
    ids = rows.ids
    gguf = find_gguf() if options.llamacpp and ctx.device.type == "cpu" else None
    reason = (llamacpp_unavailable(gguf) if gguf is not None else
              "switched off (engines.llamacpp=False)" if not options.llamacpp else
              "measured on the CPU only (this run is on a GPU)")
    if reason is None:
        peer = LlamaCppGreedy(gguf, threads=torch.get_num_threads(), context=len(ids) + options.new_tokens + 8)
        rows.engines[LLAMACPP] = (lambda n: peer.generate(ids, n), gguf.stat().st_size)
    else:
        rows.absent[LLAMACPP] = reason


def section_engines(ctx: BenchContext, options: EnginesOptions) -> dict:
    """labsupport against every peer, side by side: tokens/s, prefill, decode, fraction of
    bandwidth, compile time, same tokens. Introduced in notebook 00 (where the time goes).
    The int4 row is the run's int4 variant (`BenchContext.variants`)."""
    new_tokens, repeats = options.new_tokens, options.repeats
    model, tok = ctx.model(torch.float32)
    ids = tok.encode(chat_prompt(tok, DEFAULT_PROMPT))
    paths: dict = {}
    engines, absent, compile_s, kernels = _engines(ctx, options, ids, paths)
    outputs = {}
    nbytes, _ = copy_timing(ctx.device, repeats=1)
    source = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    destination = torch.empty_like(source)

    def full(name):
        def run():
            outputs[name] = engines[name][0](new_tokens)
        return run

    def copies():
        for _ in range(COPIES_PER_SAMPLE):
            destination.copy_(source)

    values = source.view(torch.float32)                     # the same bytes, read as float32 (normal numbers)

    def reads():
        for _ in range(COPIES_PER_SAMPLE):
            values.sum()

    short = {name: (lambda name=name: engines[name][0](WARMUP_TOKENS)) for name in engines}
    whole = time_side_by_side({**{name: full(name) for name in engines}, COPY: copies, READ: reads},
                              ctx.device, warmup=1, repeats=repeats, warmup_fns=short)
    first = time_side_by_side({name: (lambda name=name: engines[name][0](1)) for name in engines},
                              ctx.device, warmup=1, repeats=repeats)
    busy = busy_reason(whole) or busy_reason(first)
    bandwidth = copy_bandwidth(nbytes * COPIES_PER_SAMPLE, whole[COPY].median)
    read = read_bandwidth(nbytes * COPIES_PER_SAMPLE, whole[READ].median)
    threads = torch.get_num_threads() if ctx.device.type == "cpu" else None   # per core: a CPU's figure
    kv_bytes = kv_cache_bytes(model.config, len(ids) + new_tokens // 2, 1, torch.float32)

    reference = outputs[OURS]
    rows = {}
    for name, (_, weight_bytes) in engines.items():
        prefill = first[name].median
        decode_s = max(whole[name].median - prefill, 1e-9)
        decode_tps = (new_tokens - 1) / decode_s
        tokens = outputs[name]
        agree = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), len(tokens))
        rows[name] = {"tokens_per_s": new_tokens / whole[name].median, "prefill_s": prefill,
                      "decode_tokens_per_s": decode_tps, "weight_bytes_per_step": weight_bytes,
                      "bandwidth_fraction": (weight_bytes + kv_bytes) * decode_tps / bandwidth,
                      "read_bandwidth_fraction": (weight_bytes + kv_bytes) * decode_tps / read,
                      "weight_gb_per_s": weight_bytes * decode_tps / 1e9,
                      "weight_gb_per_s_per_core": weight_bytes * decode_tps / 1e9 / threads if threads else None,
                      "same_tokens_as_labsupport_fp32": tokens == reference,
                      "tokens_agreeing_with_labsupport_fp32": agree,
                      "compile_s": compile_s.get(name), "kernel": kernels.get(name),
                      "decode_paths": sorted(paths.get(name, ()))}
    long = long_prefill(ctx, ids, repeats) if LLAMACPP in rows else {}
    knee = decode_knee(ctx, ids, max(2, new_tokens // 2), repeats) if LLAMACPP in rows else {}
    batched = knee.get(BATCH_ROWS, {})
    if LLAMACPP in rows:                 # the same Q4_1 weights: how long do the two int4 engines agree?
        rows[LLAMACPP]["tokens_agreeing_with_labsupport_int4"] = next(
            (i for i, (a, b) in enumerate(zip(outputs[LLAMACPP], outputs[OURS_INT4])) if a != b),
            len(outputs[LLAMACPP]))
    return {"prompt_tokens": len(ids), "new_tokens": new_tokens, "batch": 1,
            "copy_bandwidth_bytes_per_s": bandwidth, "read_bandwidth_bytes_per_s": read,
            "copies_per_sample": COPIES_PER_SAMPLE, "threads": threads,
            "kv_cache_bytes_per_step_mean": kv_bytes, "rows": rows, "absent": absent,
            "timings_s": {k: v.to_dict() for k, v in whole.items()},
            "prefill_timings_s": {k: v.to_dict() for k, v in first.items()},
            "long_prefill_s": {k: v.to_dict() for k, v in long.items()}, "batched_decode": batched,
            "decode_knee": {str(r): result for r, result in knee.items()},
            "figures": _figures(rows, absent, busy, ctx.device) + long_prefill_figures(long) + batched_figures(batched)
            + knee_figures(knee)}


def _ratio_figure(rows: dict, absent: dict, ours: str, theirs: str, key: str, target: float,
                  busy: str | None, what: str) -> dict | None:
    """`ours` / `theirs` on `key`, or None when either row is missing (its reason goes in the note)."""
    missing = next((n for n in (ours, theirs) if n not in rows), None)
    if missing is not None:
        return reported(f"{ours} / {theirs} ({what})", float("nan"), "x", target=None,
                        note=f"not measured: {missing}: {absent.get(missing, 'absent')}")
    value = rows[ours][key] / rows[theirs][key]
    agree = [rows[n]["tokens_agreeing_with_labsupport_fp32"] for n in (ours, theirs)]
    int4 = rows[theirs].get("tokens_agreeing_with_labsupport_int4")
    return reported(f"{ours} / {theirs} ({what})", value, "x", target=target, busy=busy,
                    note=f"{rows[ours][key]:.1f} vs {rows[theirs][key]:.1f} {what}; first tokens agreeing "
                         f"with labsupport fp32: {agree[0]} and {agree[1]}"
                         + (f"; with each other: {int4}" if int4 is not None else ""))


def _figures(rows: dict, absent: dict, busy: str | None, device="cpu") -> list[dict]:
    """The section's figures, each with the decode paths of the rows it reads; on a GPU one
    read from a row that was not graphed is a failed measurement (`measure.mark_graphed`)."""
    def checked(figure, *names):
        return mark_graphed(figure, [p for n in names for p in rows.get(n, {}).get("decode_paths", ())], device)

    pairs = [(OURS, HF), (OURS, HF_STATIC), (OURS_COMPILED, OURS), (OURS_INT4, LLAMACPP),
             (OURS_INT4_COMPILED, LLAMACPP), (OURS_INT4, OURS_INT4_ATEN)]
    figures = [
        _ratio_figure(rows, absent, OURS, HF, "tokens_per_s", 1.5, busy, "tokens/s"),
        _ratio_figure(rows, absent, OURS, HF_STATIC, "tokens_per_s", 1.0, busy, "tokens/s"),
        _ratio_figure(rows, absent, OURS_COMPILED, OURS, "decode_tokens_per_s", None, busy, "decode tokens/s"),
        _ratio_figure(rows, absent, OURS_INT4, LLAMACPP, "decode_tokens_per_s", INT4_TARGET, busy, "decode tokens/s"),
        _ratio_figure(rows, absent, OURS_INT4_COMPILED, LLAMACPP, "decode_tokens_per_s", INT4_TARGET, busy,
                      "decode tokens/s"),
        _ratio_figure(rows, absent, OURS_INT4, OURS_INT4_ATEN, "decode_tokens_per_s", None, busy, "decode tokens/s"),
    ]
    figures = [checked(f, *pair) for f, pair in zip(figures, pairs)]
    for name, row in rows.items():
        figures.append(checked(reported(f"{name}: fraction of copy bandwidth in decode", row["bandwidth_fraction"],
                                        "fraction", busy=busy,
                                        note=f"{row['weight_bytes_per_step'] / 1e6:.0f} MB of weights per step, "
                                             f"{row['decode_tokens_per_s']:.1f} decode steps/s: "
                                             f"{row['weight_bytes_per_step'] * row['decode_tokens_per_s'] / 1e9:.2f} GB/s of weights"
                                             + (f", {row['weight_gb_per_s_per_core']:.2f} GB/s per core"
                                                if row.get("weight_gb_per_s_per_core") else "")), name))
        figures.append(checked(reported(f"{name}: fraction of read bandwidth in decode", row["read_bandwidth_fraction"],
                                        "fraction", target=READ_TARGETS.get(name), busy=busy,
                                        note=f"weights and the KV cache read per step x decode steps/s, over a sum "
                                             f"of the copy probe's buffer on the same threads; "
                                             f"{row['bandwidth_fraction']:.0%} of copy bandwidth"), name))
    return figures
