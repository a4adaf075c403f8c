"""Timing generation against batch size: what a batch buys in throughput and costs in latency.

Introduced in notebook 02 (batching), as `kv_cache_timing` is for notebook 01: the
measurements that run `generate`, kept apart from `batching` itself (left
padding, the mask, positions), which `generate` builds on.
"""

from __future__ import annotations

from ..engine.padding import padding_waste
from ..engine.generation import generate
from .measure import WARMUP_TOKENS, require_graphed, time_fn, time_side_by_side, timed_compile
from .timing_model import batches_that_fit, capped


def measure_batch(model, prompts, new_tokens: int = 16, repeats: int = 1, warmup: int = 1) -> dict:
    """Generate `new_tokens` for every prompt of one batch (no early stop) and time it.

    Introduced in notebook 02 (batching). Returns a dict: batch, seconds (whole
    call, median), tokens_per_s (new tokens of all rows / seconds), ms_per_token
    (one decode step: the time between two tokens of one row), prefill_s, and
    padding_waste of the prompts, decode_path and warmup_s (compiling and recording the CUDA
    graph on a GPU, apart from the timed seconds; `measure.timed_compile`).
    """
    results = []
    graphed = timed_compile(model.device)
    timing = time_fn(lambda: results.append(generate(model, prompts, new_tokens, eos_token_ids=(), compile=graphed)),
                     model.device, warmup=warmup, repeats=repeats)
    timed = [require_graphed(r, f"batch {len(prompts)}", model.device) for r in results[-repeats:]]
    steps = max(new_tokens - 1, 1)
    decode = sorted(r.decode_seconds for r in timed)[len(timed) // 2]
    prefill_s = sorted(r.prefill_seconds for r in timed)[len(timed) // 2]
    batch = len(prompts)
    return {"batch": batch, "seconds": timing.median, "tokens_per_s": batch * new_tokens / timing.median,
            "ms_per_token": 1e3 * decode / steps, "prefill_s": prefill_s,
            "padding_waste": padding_waste([len(p) for p in prompts]), "decode_path": timed[0].decode_path,
            "warmup_s": sum(r.warmup_seconds for r in results)}


def sweep_batch_sizes(model, prompt: list[int], batches, new_tokens: int = 16, repeats: int = 1,
                      progress=None) -> list[dict]:
    """`measure_batch` for the same prompt repeated `batch` times, at each batch size.

    Introduced in notebook 02 (batching). Small batches get a warm-up call;
    larger ones are timed once as they come on a CPU (slow there; warmed up on a GPU). On a GPU
    the batches whose cache and prefill would not fit the free memory are left out, and the
    returned `timing_model.Sweep`'s ``note`` says which (`timing_model.batches_that_fit`).
    """
    batches, note = batches_that_fit(model.config, batches, len(prompt) + new_tokens, model.dtype,
                                     model.device, tokens=len(prompt))
    rows = []
    for batch in batches:
        if progress is not None:
            progress(f"batch {batch}...")
        rows.append(measure_batch(model, [prompt] * batch, new_tokens, repeats=repeats,
                                  warmup=1 if batch <= 4 or model.device.type != "cpu" else 0))
    return capped(rows, note)


def batch_speedup(model, prompt: list[int], batch: int = 16, new_tokens: int = 16, warmup: int = 1,
                  repeats: int = 3) -> tuple[float, dict]:
    """Throughput at `batch` rows over batch 1: `prompt` repeated, timed side by side, no early stop.

    Introduced in notebook 02 (batching): the chapter's "batch 1 -> 16" question. Returns
    (batch x median of "batch 1" / median of "batch {batch}", the `Timing` of each by name).
    On a GPU both are replayed CUDA graphs (`measure.timed_compile`), else a LabError.
    """
    graphed = timed_compile(model.device)

    def runs(n: int) -> dict:
        def run(b: int):
            name = f"batch {b}"
            return lambda: require_graphed(generate(model, [prompt] * b, n, eos_token_ids=(), compile=graphed),
                                           name, model.device)
        return {f"batch {b}": run(b) for b in (1, batch)}
    timings = time_side_by_side(runs(new_tokens), model.device, warmup=warmup, repeats=repeats,
                                warmup_fns=runs(min(new_tokens, WARMUP_TOKENS)))
    return batch * timings["batch 1"].median / timings[f"batch {batch}"].median, timings
