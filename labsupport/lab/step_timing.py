"""One decode step, timed on top of a filled cache and rolled back: the one home of that recipe.

Introduced in notebook 00 (where the time goes); notebooks 01 (KV cache) and 08 (long
context) time their decode steps the same way.

A decode step's time depends on how many positions the cache holds, not on what they
hold. So instead of running a long prompt through the model (a real prefill of 16 rows x
2048 positions takes minutes on a CPU), `filled_cache` writes seeded random keys and values
through the cache's own protocol (`reserve`, then every layer's `update`), leaving room
for one more position; `step_runner` returns a function that runs one decode step there
and rolls the cache back (`truncate`), so that every timed call does the same work.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..engine.compiled import fixed_shape_step
from ..engine.generation import decode_step
from ..engine.kv_cache import StaticKVCache
from ..engine.kv_quant import Int8KVCache
from ..errors import LabError
from ..inputs import whole_number
from .measure import EAGER_STEP, GRAPHED_STEP, captured, time_fn, time_side_by_side

CACHE_KINDS = ("float", "int8")       # a StaticKVCache in the model's dtype, or an Int8KVCache


def filled_cache(model, batch: int, context: int, kind: str = "float", seed: int = 0):
    """A cache of `model` holding `context` positions of seeded random keys and values per row,
    with room for one more (the decode step to time). kind: "float" (a `StaticKVCache` in the
    model's dtype) or "int8" (an `Int8KVCache`). Introduced in notebook 00 (where the time goes)."""
    if kind not in CACHE_KINDS:
        raise LabError(f"Unknown cache kind {kind!r}; choose one of {CACHE_KINDS}.")
    batch = whole_number(batch, "batch")
    context = whole_number(context, "context (the positions to fill)", minimum=0,
                           maximum=model.config.max_position - 1)
    cache_class = StaticKVCache if kind == "float" else Int8KVCache
    cache = cache_class.for_model(model, batch, context + 1)
    if context == 0:
        return cache
    config = model.config
    generator = torch.Generator(device=model.device).manual_seed(seed)
    shape = (batch, config.num_kv_heads, context, config.head_dim)                   # one layer's keys
    writer = cache.reserve(context)                                                  # positions [0, context)
    with torch.inference_mode():
        for layer in range(config.num_layers):
            keys, values = (torch.randn(shape, generator=generator, device=model.device, dtype=model.dtype)
                            for _ in range(2))
            writer.update(layer, keys, values)
    return cache


def greedy_step(model, cache, next_tokens: torch.Tensor) -> torch.Tensor:
    """One eager decode step and the greedy pick of each row's next token (batch,): what a
    generation loop does per token. Notebook 00 (where the time goes)."""
    return decode_step(model, cache, next_tokens).argmax(dim=-1)


def step_runner(model, cache, step: Callable | None = None, seed: int = 0,
                graphed: bool | None = None) -> Callable[[], torch.Tensor]:
    """A function that runs one decode step of seeded random tokens (one per row) on `cache`
    and rolls the cache back to what it held, so that it can be timed again and again.
    step(model, cache, next_tokens) is the work of one step (default: `decode_step`, returning
    its logits). graphed: replay the step as a CUDA graph (`measure.captured`); None: on CUDA,
    where a step timed launch by launch would measure the launches. Only notebook 00's profile,
    whose lesson is the launches, passes False. The runner's ``path`` says which ran.
    Notebook 00 (where the time goes)."""
    step = step or decode_step
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (cache.batch_size,), generator=generator)
    tokens = tokens.to(model.device)                                                  # (batch,)

    def run():
        filled = cache.length
        with torch.inference_mode():
            out = step(model, cache, tokens)
        cache.truncate(filled)
        return out
    run.path = EAGER_STEP                        # a replay that takes its place says GRAPHED_STEP
    return captured(run, model.device, f"the decode step of {model.config.name} at batch {cache.batch_size} "
                                       f"after {cache.length} positions", graphed)


def graphed_decode_seconds(model, batch: int, context: int, repeats: int = 5) -> float:
    """Median seconds of one decode step of `batch` rows over `context` cached positions, with
    the launches taken out: on CUDA the step (the fixed-shape step the compiled decoder
    compiles, run eagerly here, so nothing is compiled) is captured once as a CUDA graph and
    the graph is replayed; elsewhere the same step is timed as it is. A batch sweep timed so
    shows where the step's own work starts to grow with the batch (the knee), which a small
    model's launch overhead would hide. Notebook 00 (where the time goes); the GPU check's
    batching item (scripts/gpu_items.py) is its caller."""
    cache = filled_cache(model, batch, context)                        # room for the one step
    writer = cache.reserve(1, fixed_shape=True)                        # writes position `context`
    cache.truncate(context)
    device = model.device
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)                  # (batch, 1)
    positions = torch.full((batch, 1), context, dtype=torch.long, device=device)      # (batch, 1)
    key_mask = torch.ones(batch, context + 1, dtype=torch.bool, device=device)        # (batch, context + 1)

    def step():
        with torch.inference_mode():
            return fixed_shape_step(model, tokens, positions, writer, key_mask)
    if device.type != "cuda":
        return time_fn(step, device, warmup=1, repeats=repeats).median
    replay = captured(step, device, f"the fixed-shape decode step at batch {batch}")
    return time_fn(replay, device, warmup=2, repeats=repeats).median


def eager_against_graphed(model, batch: int, context: int, repeats: int = 10) -> dict:
    """The same decode step (`batch` rows after `context` cached positions) launched operator by
    operator and replayed as one CUDA graph, timed side by side: {"eager": Timing, "CUDA graph":
    Timing}. Their difference is what launching the step's kernels costs. The one place a GPU
    step is timed eagerly on purpose: the launches are its lesson. Call it on a CUDA GPU (a CPU
    has no graph to replay). Notebook 00 (where the time goes)."""
    cache = filled_cache(model, batch, context)
    steps = {"eager": step_runner(model, cache, graphed=False), GRAPHED_STEP: step_runner(model, cache, graphed=True)}
    return time_side_by_side(steps, model.device, warmup=2, repeats=repeats)
