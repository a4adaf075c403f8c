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
  up to the model's context (`bucket_length`); the caches of each (model, purpose) are kept
  for reuse while they fit `keep_bytes` (`cache_budget`: an eighth of a GPU's memory), the
  least recently used dropped first, so that a sweep of batch sizes (notebook 02) holds one
  large cache at a time, never one per point (`cache_for`, `cache_bytes`); `step` adds the
  bucket's extra rows itself and drops their logits, and padding slots are hidden by the mask;
* `warm_up` compiles (and on a GPU records the CUDA graph) before a generation is timed,
  once per (model, cache, width, `layer_signature`): a layer swapped in place is a new graph,
  so notebook 04's variants of one model each warm up and get their own verdict; it says
  what ran: `DecodePath` ("eager", "compiled", "compiled + CUDA graphs"), the warm-up seconds,
  the graphs compiled, the CUDA-graph skips, and one sentence (also a warning) whenever the
  fast path was asked for and not taken;
* the same step over T tokens per row (`verify`, warmed up with ``width=T``) is speculative
  decoding's verify pass (notebook 05): [pending, d_1..d_k] at positions start..start + k,
  every position's logits; one graph per k + 1 serves every pass (shorter ones are padded).

`generate(..., compile=True)` uses `SHARED` (a decoder with inductor's defaults, whose
state is its compiled steps and caches, held weakly per model); `generate(..., compile=d)`
uses the decoder d, e.g. ``CompiledDecoder(inductor_options={"freezing": True})``;
`speculative_generate(..., compile=...)` takes the same values.

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
from ..inputs import whole_number
from .hardware import synchronize
from .kv_cache import StaticKVCache, kv_cache_bytes
from .models import fused
from .models.masks import fixed_decode_mask

MIN_LENGTH_BUCKET = 64
RECOMPILE_LIMIT = 64              # graphs on the step's code object, all decoders and models together
# Calls that warm a new shape up: on CUDA, cudagraph trees run the graph once eagerly, record it
# on the second call and replay it from the third; on a CPU the first call compiles.
WARMUP_CALLS = {"cuda": 3}
GPU_CACHE_SHARE = 8               # the caches kept per (model, purpose): an eighth of a GPU's memory,
CACHE_BYTES_ELSEWHERE = 2**29     # 512 MiB on a CPU (`cache_budget`)
EAGER, COMPILED, CUDA_GRAPHS = "eager", "compiled", "compiled + CUDA graphs"


def bucket_rows(batch: int) -> int:
    """Rows of the compiled step for `batch` rows: the next power of two (1, 2, 4, 8, ...).
    Notebook 07 (putting it together)."""
    return 1 << (batch - 1).bit_length()


def bucket_length(needed: int, max_position: int) -> int:
    """Cache length of the compiled step for `needed` positions: the next power of two from
    64 on, at most the model's context. Notebook 07 (putting it together)."""
    return min(max(MIN_LENGTH_BUCKET, 1 << (needed - 1).bit_length()), max_position)


def cache_bytes(config, batch: int, needed: int, dtype) -> int:
    """Bytes of the cache `CompiledDecoder.cache_for` makes for `batch` rows and `needed` positions: its
    buckets' (`bucket_rows`, `bucket_length`), not the shape asked for. Notebook 02 (batching)."""
    return kv_cache_bytes(config, bucket_length(needed, config.max_position), bucket_rows(batch), dtype)


def cache_budget(device) -> int:
    """Bytes of caches a `CompiledDecoder` keeps for one (model, purpose) on `device` by default:
    an eighth of a GPU's memory (a T4: 1.9 GiB), 512 MiB elsewhere. A cache larger than that is
    still made, alone. Notebook 02 (batching): its sweep never holds a cache per batch point."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // GPU_CACHE_SHARE
    return CACHE_BYTES_ELSEWHERE


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


class ReportsDecodePath:
    """A result holding the `DecodePath` its decode steps ran on (`path`), read under the names the
    notebooks use: decode_path, warmup_seconds, compiles, cudagraph_skips, decode_note.
    `GenerationResult` and `SpeculativeResult` are such results. Notebook 07 (putting it together)."""

    path: DecodePath
    decode_path = property(lambda self: self.path.path, doc="str: what the decode steps ran on")
    warmup_seconds = property(lambda self: self.path.warmup_seconds, doc="float: compiling and recording")
    compiles = property(lambda self: self.path.compiles, doc="int: graphs compiled in this call")
    cudagraph_skips = property(lambda self: self.path.cudagraph_skips, doc="int: CUDA graphs torch declined")
    decode_note = property(lambda self: self.path.note, doc="str | None: why the fast path was not taken")


PATH_ORDER = (EAGER, COMPILED, CUDA_GRAPHS)        # slowest first


def slowest(*paths: DecodePath) -> DecodePath:
    """One `DecodePath` for a generation whose steps ran on each of `paths` (speculative
    decoding: the draft's steps and the target's verify passes, notebook 05): the slowest
    path, the warm-ups, compiles and skips added up, the notes joined."""
    return DecodePath(min((p.path for p in paths), key=PATH_ORDER.index),
                      sum(p.warmup_seconds for p in paths), sum(p.compiles for p in paths),
                      sum(p.cudagraph_skips for p in paths),
                      " ".join(p.note for p in paths if p.note) or None)


def fixed_shape_step(model, tokens: torch.Tensor, positions: torch.Tensor, writer, key_mask: torch.Tensor,
                     every_position: bool = False):
    """One step of fixed shapes: tokens, positions (rows, T), T = 1 for a decode step; writer:
    the cache's `FixedShapeWriter` (the T slots to write, as a tensor); key_mask (rows, max_len),
    False on padding slots. Returns the last position's logits (rows, vocab), or with
    `every_position` every position's (rows, T, vocab): speculative decoding's verify pass
    (notebook 05). What `CompiledDecoder` compiles. Notebook 07 (putting it together)."""
    mask = fixed_decode_mask(key_mask.shape[1], writer.positions, key_mask,
                             window=model.config.attention_window)           # (rows, 1, T, max_len)
    hidden = model(tokens, positions, writer, mask)                           # (rows, T, hidden)
    return model.logits(hidden) if every_position else model.logits(hidden, at=-1)   # (rows, T, vocab) / (rows, vocab)


def mark_static(cache: StaticKVCache) -> None:
    """Mark the cache's keys and values as static graph inputs (the same addresses every call),
    as Hugging Face's StaticCache does, so that a CUDA graph may write them in place.
    Notebook 07 (putting it together)."""
    for tensor in (cache.keys, cache.values, cache.layer_ids):
        torch._dynamo.mark_static_address(tensor)


def cudagraph_counts() -> tuple[int, int, int]:
    """torch's counts so far: (graphs compiled, CUDA graphs skipped, CUDA graphs recorded); their changes
    around a warm-up, ours or a peer's (`bench.core.GraphCount`), say what it ran on. Notebook 07."""
    from torch._dynamo.utils import counters
    return (counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"],
            counters["inductor"]["cudagraph_recorded_non_static_inputs"])


def graphs_verdict(skips: int, recorded: int) -> str | None:
    """None where a warm-up that asked for CUDA graphs recorded some and skipped none; else the
    sentence saying that the step runs without them. Notebook 07 (putting it together)."""
    return None if recorded and not skips else (
        f"The compiled decode step runs without CUDA graphs here (torch skipped {skips} and recorded "
        f"{'some' if recorded else 'none'}; TORCH_LOGS=cudagraphs says why), so each kernel is launched on its own.")


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own count).
    Notebook 07 (putting it together): `generate` compares it before and after decoding."""
    return cudagraph_counts()[0]


def layer_signature(model) -> tuple:
    """The type and identity of each of `model`'s modules: swapping layers in place (notebook 04's
    quantized variants of one model) changes it, and with it the graph the step compiles to.
    Notebook 07 (putting it together): `CompiledDecoder.warm_up` keeps a verdict per signature."""
    return tuple((type(m), id(m)) for m in model.modules())


def recompiled(path: DecodePath, graphs: int) -> DecodePath:
    """`path` after `graphs` compiles that happened while decoding, past the warm-up: counted,
    and said in a warning and the note (their seconds are in the decode time). Notebook 07."""
    note = (f"The compiled decode step was compiled {graphs} more time(s) while decoding, after its warm-up "
            f"(TORCH_LOGS=recompiles says why), and that time counts as decode time.")
    warnings.warn(note, stacklevel=3)
    return replace(path, compiles=path.compiles + graphs, note=" ".join(filter(None, (path.note, note))))


class CompiledDecoder:
    """Compiled decode steps for `generate` (and speculative decoding's draft steps and verify
    passes), with every piece of compile state: the compiled step per device type, one cache
    per (model, rows bucket, length bucket, purpose), and what each (model, cache, width, layers)
    ran on. Introduced in notebook 07 (putting it together).

    inductor_options: torch._inductor.config names (e.g. {"freezing": True}); on CUDA the step
        is also captured as a CUDA graph unless they set "triton.cudagraphs" to False.
    backend: torch.compile's backend ("inductor"; tests count compiles with another).
    keep_bytes: the bytes of caches kept for reuse per (model, purpose), the one in use
        included (a larger one is still made, alone); None: `cache_budget` of the model's device.
    """

    def __init__(self, inductor_options: dict | None = None, backend="inductor", keep_bytes: int | None = None):
        if inductor_options is not None and not isinstance(inductor_options, dict):
            raise LabError(f"inductor_options must be a dict of torch._inductor.config names, "
                           f"got {type(inductor_options).__name__}.")
        self.inductor_options = dict(inductor_options or {})
        self.backend = backend
        self.keep_bytes = None if keep_bytes is None else whole_number(keep_bytes, "keep_bytes", minimum=0)
        self._steps: dict[str, object] = {}
        # model -> {(rows, length, purpose): cache}
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # model -> {cache: {(width, layer_signature): DecodePath}}
        self._paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def options_for(self, device_type: str) -> dict | None:
        """The inductor options the step compiles with on `device_type` (None: none)."""
        if self.backend != "inductor":
            return None
        options = dict(self.inductor_options)
        if device_type == "cuda":
            options.setdefault("triton.cudagraphs", True)
        return options or None

    def cache_for(self, model, batch: int, needed: int, purpose: str = "decode") -> StaticKVCache:
        """An empty cache of `model` for `batch` rows and `needed` positions, rounded up to the
        buckets and reused from one generation to the next. purpose: a name that keeps caches
        apart which are in use at once (speculative decoding's "verify" and "draft", notebook 05,
        which may be one model). Before a new cache is made, the least recently used caches of
        the same (model, purpose) are dropped until all fit `keep_bytes`, or none is left."""
        rows, length = bucket_rows(batch), bucket_length(needed, model.config.max_position)
        caches, key = self._caches.setdefault(model, {}), (rows, length, purpose)
        cache = caches.pop(key, None)                  # put back last: the most recently used
        if cache is None or cache.dtype != model.dtype or cache.device != model.device:
            cache = None                               # the old one (another dtype or device) is dropped first
            self._make_room(caches, purpose, cache_bytes(model.config, batch, needed, model.dtype), model.device)
            cache = StaticKVCache.for_model(model, rows, length)
        caches[key] = cache
        cache.truncate(0)
        return cache

    def _make_room(self, caches: dict, purpose: str, new_bytes: int, device) -> None:
        """Drop `purpose`'s caches from `caches`, least recently used first, until they and a new
        cache of `new_bytes` fit the budget (or none of them is left)."""
        budget = cache_budget(device) if self.keep_bytes is None else self.keep_bytes
        mine = [key for key in caches if key[2] == purpose]             # oldest first
        held = sum(caches[key].nbytes for key in mine)
        while mine and held + new_bytes > budget:
            held -= caches.pop(mine.pop(0)).nbytes

    def held_bytes(self, model) -> int:
        """Bytes of the caches this decoder holds for `model` now (every purpose). Notebook 02 (batching)."""
        return sum(cache.nbytes for cache in self._caches.get(model, {}).values())

    def _step_fn(self, device_type: str):
        if device_type not in self._steps:
            self._steps[device_type] = torch.compile(fixed_shape_step, backend=self.backend, fullgraph=True,
                                                     dynamic=False, options=self.options_for(device_type))
        return self._steps[device_type]

    @torch.inference_mode()
    def step(self, model, cache: StaticKVCache, tokens: torch.Tensor, positions: torch.Tensor | None = None,
             key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One compiled decode step of a batch's B rows, B <= the cache's rows (its bucket), called
        as `generation.decode_step` is: tokens (B,); positions (B, 1), None for the cache's length
        (no padding); key_mask (B, max_len), False on padding, None for none. The cache hands out
        the slot (`reserve`, which moves its length on). Returns logits (B, vocab), copied out of
        the graph's buffers before the next replay overwrites them.

        The step always has the bucket's rows: the rows past B are added here as copies of the
        first, and their logits dropped. Each row of a step is computed on its own, so what they
        hold never reaches the batch's (their prefill slots are never written)."""
        batch, rows, device = tokens.shape[0], cache.batch_size, tokens.device
        if positions is None:
            positions = torch.full((batch, 1), cache.length, dtype=torch.long, device=device)   # (B, 1)
        if key_mask is None:
            key_mask = torch.ones(batch, cache.max_len, dtype=torch.bool, device=device)        # (B, max_len)
        # always new tensors, made here: contiguous and in inference mode, as in the warm-up
        # (a tensor of other strides, or made outside inference mode, is another graph: a recompile)
        tokens, positions, key_mask = (torch.cat([t, t[:1].expand(rows - batch, *t.shape[1:])])
                                       for t in (tokens, positions, key_mask))          # each (rows, ...)
        writer = cache.reserve(1, fixed_shape=True)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            logits = self._step_fn(model.device.type)(model, tokens[:, None], positions, writer, key_mask)
        return logits[:batch].clone()

    @torch.inference_mode()
    def verify(self, model, cache: StaticKVCache, tokens: torch.Tensor, positions: torch.Tensor,
               key_mask: torch.Tensor) -> torch.Tensor:
        """One compiled pass of T tokens per row, every position's logits: speculative decoding's
        verify pass over [pending, d_1..d_k] (notebook 05). tokens, positions (rows, T);
        key_mask (rows, max_len). The cache hands out the T slots. Returns (rows, T, vocab),
        copied out of the graph's buffers. T = 1 runs the decode step's graph (`step`)."""
        if tokens.shape[1] == 1:
            return self.step(model, cache, tokens[:, 0], positions, key_mask)[:, None]    # (rows, 1, vocab)
        writer = cache.reserve(tokens.shape[1], fixed_shape=True)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            logits = self._step_fn(model.device.type)(model, tokens, positions, writer, key_mask,
                                                      every_position=True)
        return logits.clone()

    def warm_up(self, model, cache: StaticKVCache, width: int = 1) -> DecodePath:
        """Compile (and on a GPU record) the step of `width` tokens per row (1: `step`, more:
        `verify`) for this model and cache before anything is timed, and say what it runs on.
        The dummy steps write the slots after what the cache holds and are rolled back
        (`truncate`); the real steps overwrite them. Never raises for a failing compile: the
        path is then "eager", with the reason in a warning and the note. Warmed up once per
        `layer_signature` of the model: the same model with swapped layers warms up again."""
        paths = self._paths.setdefault(model, weakref.WeakKeyDictionary()).setdefault(cache, {})
        key = (width, layer_signature(model))
        known = paths.get(key)
        if known is not None:
            return DecodePath(known.path, note=known.note)
        mark_static(cache)
        fused.prepare(cache.device)      # CPU kernels load before the trace, which then never recompiles for them
        rows, filled, device = cache.batch_size, cache.length, cache.keys.device
        tokens = torch.zeros(rows, width, dtype=torch.long, device=device)                 # (rows, width)
        positions = torch.zeros(rows, width, dtype=torch.long, device=device)              # (rows, width)
        key_mask = torch.ones(rows, cache.max_len, dtype=torch.bool, device=device)        # (rows, max_len)
        graphs, skips, recorded = cudagraph_counts()
        start = time.perf_counter()
        try:
            for _ in range(WARMUP_CALLS.get(cache.device.type, 1)):
                if width == 1:
                    self.step(model, cache, tokens[:, 0], positions, key_mask)
                else:
                    self.verify(model, cache, tokens, positions, key_mask)
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
            paths[key] = DecodePath(EAGER, note=note)
            return DecodePath(EAGER, compiles=graphs_compiled() - graphs, note=note)
        seconds = time.perf_counter() - start
        graphs, skips, recorded = (now - then for now, then in zip(cudagraph_counts(), (graphs, skips, recorded)))
        path, note = COMPILED, None
        if cache.device.type == "cuda" and (self.options_for("cuda") or {}).get("triton.cudagraphs"):
            note = graphs_verdict(skips, recorded)
            path = COMPILED if note else CUDA_GRAPHS
            if note:
                warnings.warn(note, stacklevel=3)
        paths[key] = DecodePath(path, note=note)
        return DecodePath(path, seconds, graphs, skips, note)

    def release(self, model) -> None:
        """Forget `model`'s caches and warm-up records (its compiled graphs stay with torch)."""
        self._caches.pop(model, None)
        self._paths.pop(model, None)


SHARED = CompiledDecoder()
