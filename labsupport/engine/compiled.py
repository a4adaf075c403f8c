"""The compiled decode step: torch.compile of one fixed-shape decode step, CUDA graphs on a GPU.

Introduced in notebook 07 (putting it together); notebook 00 profiles the step it runs.

A small model's decode step is mostly overhead: Python, the framework's dispatch and one
kernel launch per operation. torch.compile fuses the operations; a CUDA graph then
replays every kernel of the step in one launch. Both need a step whose shapes and
addresses never change, so the step here (`fixed_shape_step`) writes the cache at a
position *tensor* (`StaticKVCache.reserve(1, fixed_shape=True)`), attends over the whole
preallocated cache and hides the slots not written yet with a mask
(`masks.fixed_decode_mask`, with the model's sliding window). Each write is one `index_put_`
on the whole cache buffer: with a write into a per-layer view instead, inductor's generated
code (TORCH_LOGS=output_code, on this CPU) copied every layer's buffer and wrote the whole
cache back at every step; with `index_put_` it writes the one new slot in place.

`CompiledDecoder` owns all compile state; nothing is set on the model:

* one compiled step per device type (fullgraph=True, dynamic=False: one graph per shape);
* shapes are rounded up to buckets, so that many prompt lengths and batch sizes share
  a few graphs: rows to 1, 2, 4, 8, ... (`bucket_rows`), cache length to 64, 128, 256, ...
  up to the model's context (`bucket_length`); one cache per (model, rows, length) is
  kept and reused (`cache_for`); padding rows and slots are hidden by the mask;
* `warm_up` compiles (and on a GPU records the CUDA graph) before a generation is timed,
  and says what ran: `DecodePath` ("eager", "compiled", "compiled + CUDA graphs"), the
  warm-up seconds, the graphs compiled, the CUDA-graph skips, and one sentence (also a
  warning) whenever the fast path was asked for and not taken.

`generate(..., compile=True)` uses `SHARED` (a decoder with inductor's defaults, whose
state is its compiled steps and caches, held weakly per model); `generate(..., compile=d)`
uses the decoder d, e.g. ``CompiledDecoder(inductor_options={"freezing": True})``.

The torch source this relies on (torch 2.11 and 2.13, the same in both; file: function):

* torch/_dynamo/decorators.py: ``mark_static_address(t, guard=False)`` sets
  ``t._dynamo_static_input_type = "unguarded"``; torch/_dynamo/variables/builder.py:
  ``VariableBuilder.wrap_tensor`` records it (``_extract_tensor_dict``) and marks
  parameters and buffers static itself; torch/_functorch/_aot_autograd/frontend_utils.py:
  ``_try_get_metadata_from_dynamo`` turns the marks into ``static_input_indices``.
* torch/_inductor/cudagraph_utils.py: ``check_for_mutation``: with cudagraph trees, a graph
  that mutates an input outside ``static_input_idxs`` is not captured ("skipping cudagraphs
  due to mutated inputs"); every skip goes through ``log_cudagraph_skip_and_bump_counter``,
  which bumps ``counters["inductor"]["cudagraph_skips"]`` and logs to the "cudagraphs"
  artifact logger (silent unless TORCH_LOGS="cudagraphs"). torch/_inductor/output_code.py:
  ``cudagraph_post_compile`` skips the same way at compile time. Hence `mark_static`: the
  step's ``index_copy_`` into the cache must mutate static inputs only.
* torch/_inductor/cudagraph_trees.py: ``CUDAGraphTreeManager._run``: the first call of a
  graph runs eagerly (warm-up), the second records it (``CUDAGraphNode.__init__`` bumps
  ``counters["inductor"]["cudagraph_recorded_non_static_inputs"]``), later calls replay;
  each call of a compiled function starts a new generation (torch/_dynamo/mutation_guard.py:
  ``install_generation_tagging_init``, which torch/_dynamo/eval_frame.py runs on entering every
  compiled call, bumps ``GenerationTracker.generation``), so a replay overwrites the previous
  outputs: the step clones its logits.
* torch/_dynamo/config.py: ``recompile_limit`` (8; ``cache_size_limit`` is its alias) counts
  the graphs on one code object; torch/_dynamo/convert_frame.py: past it dynamo falls back
  to running the frame eagerly with only a log line, except with ``fullgraph=True``, where it
  raises ``FailOnRecompileLimitHit``. Hence fullgraph=True (a graph break raises too), and
  ``config.patch(recompile_limit=RECOMPILE_LIMIT)`` around the step: every decoder, model and
  shape shares `fixed_shape_step`'s code object.
* torch/_dynamo/output_graph.py: each compiled graph bumps ``counters["stats"]["unique_graphs"]``
  (the compiles a `DecodePath` reports); torch/_inductor/__init__.py: mode "reduce-overhead"
  is the option ``triton.cudagraphs=True``, which is passed as an option so that it combines
  with other inductor options.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass, replace

import torch

from ..errors import LabError, first_line
from .hardware import synchronize
from .kv_cache import StaticKVCache
from .models import fused
from .models.masks import fixed_decode_mask

MIN_LENGTH_BUCKET = 64
RECOMPILE_LIMIT = 64              # graphs on the step's code object, all decoders and models together
# Calls that warm a new shape up: on CUDA, cudagraph trees run the graph once eagerly, record it
# on the second call and replay it from the third; on a CPU the first call compiles.
WARMUP_CALLS = {"cuda": 3}
EAGER, COMPILED, CUDA_GRAPHS = "eager", "compiled", "compiled + CUDA graphs"


def bucket_rows(batch: int) -> int:
    """Rows of the compiled step for `batch` rows: the next power of two (1, 2, 4, 8, ...).
    Notebook 07 (putting it together)."""
    return 1 << (batch - 1).bit_length()


def bucket_length(needed: int, max_position: int) -> int:
    """Cache length of the compiled step for `needed` positions: the next power of two from
    64 on, at most the model's context. Notebook 07 (putting it together)."""
    return min(max(MIN_LENGTH_BUCKET, 1 << (needed - 1).bit_length()), max_position)


@dataclass(frozen=True)
class DecodePath:
    """What a generation's decode steps ran on, as `generate` reports it (notebook 07).
    path: "eager", "compiled" or "compiled + CUDA graphs"; warmup_seconds: compiling and
    recording in this call (0 once warm); compiles: graphs compiled in this call;
    cudagraph_skips: CUDA graphs torch declined; note: why the fast path asked for was not
    taken (also given as a warning), or None."""

    path: str = EAGER
    warmup_seconds: float = 0.0
    compiles: int = 0
    cudagraph_skips: int = 0
    note: str | None = None

    @property
    def compiled(self) -> bool:
        return self.path != EAGER


def fixed_shape_step(model, tokens: torch.Tensor, positions: torch.Tensor, writer, key_mask: torch.Tensor):
    """One decode step of fixed shapes: tokens, positions (rows, 1); writer: the cache's
    `FixedShapeWriter` (the slot to write, as a tensor); key_mask (rows, max_len), False on
    padding slots. Returns logits (rows, vocab). What `CompiledDecoder` compiles. Notebook 07."""
    mask = fixed_decode_mask(key_mask.shape[1], writer.positions, key_mask,
                             window=model.config.attention_window)           # (rows, 1, 1, max_len)
    return model.logits(model(tokens, positions, writer, mask), at=-1)        # (rows, vocab)


def mark_static(cache: StaticKVCache) -> None:
    """Mark the cache's keys and values as static graph inputs (the same addresses every call),
    as Hugging Face's StaticCache does, so that a CUDA graph may write them in place.
    Notebook 07 (putting it together)."""
    for tensor in (cache.keys, cache.values, cache.layer_ids):
        torch._dynamo.mark_static_address(tensor)


def _counts() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters
    return (counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"],
            counters["inductor"]["cudagraph_recorded_non_static_inputs"])


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own count).
    Notebook 07 (putting it together): `generate` compares it before and after decoding."""
    return _counts()[0]


def recompiled(path: DecodePath, graphs: int) -> DecodePath:
    """`path` after `graphs` compiles that happened while decoding, past the warm-up: counted,
    and said in a warning and the note (their seconds are in the decode time). Notebook 07."""
    note = (f"The compiled decode step was compiled {graphs} more time(s) while decoding, after its warm-up "
            f"(TORCH_LOGS=recompiles says why), and that time counts as decode time.")
    warnings.warn(note, stacklevel=3)
    return replace(path, compiles=path.compiles + graphs, note=" ".join(filter(None, (path.note, note))))


class CompiledDecoder:
    """Compiled decode steps for `generate`, with every piece of compile state: the compiled
    step per device type, one cache per (model, rows bucket, length bucket), and what each
    (model, cache) ran on. Introduced in notebook 07 (putting it together).

    inductor_options: torch._inductor.config names (e.g. {"freezing": True}); on CUDA the step
        is also captured as a CUDA graph unless they set "triton.cudagraphs" to False.
    backend: torch.compile's backend ("inductor"; tests count compiles with another).
    """

    def __init__(self, inductor_options: dict | None = None, backend="inductor"):
        if inductor_options is not None and not isinstance(inductor_options, dict):
            raise LabError(f"inductor_options must be a dict of torch._inductor.config names, "
                           f"got {type(inductor_options).__name__}.")
        self.inductor_options = dict(inductor_options or {})
        self.backend = backend
        self._steps: dict[str, object] = {}
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> {(rows, length): cache}
        self._paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # model -> {cache: DecodePath}

    def options_for(self, device_type: str) -> dict | None:
        """The inductor options the step compiles with on `device_type` (None: none)."""
        if self.backend != "inductor":
            return None
        options = dict(self.inductor_options)
        if device_type == "cuda":
            options.setdefault("triton.cudagraphs", True)
        return options or None

    def cache_for(self, model, batch: int, needed: int) -> StaticKVCache:
        """An empty cache of `model` for `batch` rows and `needed` positions, rounded up to the
        buckets and reused from one generation to the next."""
        rows, length = bucket_rows(batch), bucket_length(needed, model.config.max_position)
        caches = self._caches.setdefault(model, {})
        cache = caches.get((rows, length))
        if cache is None or cache.dtype != model.dtype or cache.device != model.device:
            cache = caches[(rows, length)] = StaticKVCache.for_model(model, rows, length)
        cache.truncate(0)
        return cache

    def _step_fn(self, device_type: str):
        if device_type not in self._steps:
            self._steps[device_type] = torch.compile(fixed_shape_step, backend=self.backend, fullgraph=True,
                                                     dynamic=False, options=self.options_for(device_type))
        return self._steps[device_type]

    @torch.inference_mode()
    def step(self, model, cache: StaticKVCache, tokens: torch.Tensor, positions: torch.Tensor,
             key_mask: torch.Tensor) -> torch.Tensor:
        """One compiled decode step: tokens (rows,), positions (rows, 1), key_mask (rows, max_len).
        The cache hands out the slot (`reserve`, which moves its length on). Returns logits
        (rows, vocab), copied out of the graph's buffers before the next replay overwrites them."""
        writer = cache.reserve(1, fixed_shape=True)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            logits = self._step_fn(model.device.type)(model, tokens[:, None], positions, writer, key_mask)
        return logits.clone()

    def warm_up(self, model, cache: StaticKVCache) -> DecodePath:
        """Compile (and on a GPU record) the step for this model and cache before anything is
        timed, and say what it runs on. The dummy steps write the slot after what the cache
        holds and are rolled back (`truncate`); the real steps overwrite it. Never raises for
        a failing compile: the path is then "eager", with the reason in a warning and the note."""
        paths = self._paths.setdefault(model, weakref.WeakKeyDictionary())
        known = paths.get(cache)
        if known is not None:
            return DecodePath(known.path, note=known.note)
        mark_static(cache)
        fused.prepare(cache.device)      # CPU kernels load before the trace, which then never recompiles for them
        rows, filled, device = cache.batch_size, cache.length, cache.keys.device
        tokens = torch.zeros(rows, dtype=torch.long, device=device)                        # (rows,)
        positions = torch.zeros(rows, 1, dtype=torch.long, device=device)                 # (rows, 1)
        key_mask = torch.ones(rows, cache.max_len, dtype=torch.bool, device=device)        # (rows, max_len)
        graphs, skips, recorded = _counts()
        start = time.perf_counter()
        try:
            for _ in range(WARMUP_CALLS.get(cache.device.type, 1)):
                self.step(model, cache, tokens, positions, key_mask)
                cache.truncate(filled)
            synchronize(cache.device)
        except Exception as error:                        # noqa: BLE001 - any failure: eager, and said so
            cache.truncate(filled)
            reason = first_line(error)
            if isinstance(error, torch._dynamo.exc.FailOnRecompileLimitHit):
                reason = (f"torch.compile holds {RECOMPILE_LIMIT} decode-step graphs already, its recompile limit "
                          f"(compiled.RECOMPILE_LIMIT; torch._dynamo.reset() forgets them all)")
            note = f"Compiled decoding is not available here ({reason}); decoding without it."
            warnings.warn(note, stacklevel=3)
            paths[cache] = DecodePath(EAGER, note=note)
            return DecodePath(EAGER, compiles=_counts()[0] - graphs, note=note)
        seconds = time.perf_counter() - start
        graphs, skips, recorded = (now - before for now, before in zip(_counts(), (graphs, skips, recorded)))
        path, note = COMPILED, None
        wants_graphs = cache.device.type == "cuda" and (self.options_for("cuda") or {}).get("triton.cudagraphs")
        if wants_graphs and (skips or not recorded):
            note = (f"The compiled decode step runs without CUDA graphs here (torch skipped {skips} and recorded "
                    f"{'some' if recorded else 'none'}; TORCH_LOGS=cudagraphs says why), so each kernel is "
                    f"launched on its own.")
            warnings.warn(note, stacklevel=3)
        elif wants_graphs:
            path = CUDA_GRAPHS
        paths[cache] = DecodePath(path, note=note)
        return DecodePath(path, seconds, graphs, skips, note)

    def release(self, model) -> None:
        """Forget `model`'s caches and warm-up records (its compiled graphs stay with torch)."""
        self._caches.pop(model, None)
        self._paths.pop(model, None)


SHARED = CompiledDecoder()
