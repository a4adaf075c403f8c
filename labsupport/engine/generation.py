"""Text generation: prefill, decode steps, and the loop around them.

Introduced in notebook 01 (KV cache).

Generation has two phases with very different costs:

* prefill: run the whole prompt through the model once, filling the KV cache;
  many tokens per weight read, so it is compute-bound on most hardware;
* decode: one new token per step, attending to the cache; every weight is read
  for a single token's worth of arithmetic, so it is memory-bound (notebook 00).

`generate_naive` is the handbook chapter's loop without a cache: each step
re-runs the model over the whole sequence. It gives the same tokens, at a cost
that grows quadratically with the length (notebook 01 measures it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .compiled import SHARED, CompiledDecoder, DecodePath, ReportsDecodePath, graphs_compiled, recompiled
from .padding import left_pad
from ..errors import LabError
from .hardware import synchronize
from ..inputs import token_id_set, token_rows, whole_number
from .kv_cache import KVCache, StaticKVCache, require_fitting_cache
from .models.masks import causal_mask, padded_key_mask
from .sampling import GREEDY, SamplingConfig, require_sampling, sample

StreamCallback = Callable[[torch.Tensor], None]


@dataclass
class GenerationResult(ReportsDecodePath):
    """What `generate` returns. tokens: (batch, new_tokens) generated ids; rows that
    finished early are padded after their end-of-sequence token with that token. Notebook 01 (KV cache)."""

    tokens: torch.Tensor
    prompt_length: int
    new_token_counts: list[int]
    prefill_seconds: float
    decode_seconds: float
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)
    # what the decode steps ran on: "eager", "compiled" or "compiled + CUDA graphs"; the warm-up
    # (compiling and recording a new shape, before anything is timed, so never in decode_seconds);
    # the graphs compiled and the CUDA graphs torch skipped in this call; and why a fast path asked
    # for was not taken. Read as result.decode_path, .warmup_seconds, ... (`ReportsDecodePath`).
    path: DecodePath = field(default_factory=DecodePath)

    @property
    def total_new_tokens(self) -> int:
        return sum(self.new_token_counts)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens produced by decode steps (the first comes from prefill) per second."""
        steps = max(self.tokens.shape[1] - 1, 0)
        return self.tokens.shape[0] * steps / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    def row(self, i: int = 0) -> list[int]:
        """Generated ids of row i, up to and including its end-of-sequence token."""
        return self.tokens[i, : self.new_token_counts[i]].tolist()


def require_fits_context(model, prompt_length: int, max_new_tokens) -> int:
    """`max_new_tokens` as an int, if it is a whole number >= 1 and the prompt plus that many
    tokens fit in the model's context; else one sentence. Notebook 01 (KV cache)."""
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens")
    context = model.config.max_position
    if prompt_length + max_new_tokens > context:
        raise LabError(
            f"The prompt has {prompt_length} tokens and max_new_tokens is {max_new_tokens}, but the "
            f"model's context holds {context} tokens; shorten the prompt or ask for fewer new tokens."
        )
    return max_new_tokens


def _mask(model, T: int, start: int, key_mask):
    """The mask of T queries after `start` cached keys, hiding the padding of `key_mask`
    (batch, >= start + T); None (the model's own default: causal, windowed) when there is none."""
    if key_mask is None:
        return None
    return causal_mask(T, start, key_mask[:, : start + T], key_mask.device, window=model.config.attention_window)


@torch.inference_mode()
def prefill(model, tokens: torch.Tensor, cache, positions=None, key_mask=None) -> torch.Tensor:
    """Run the prompt (batch, T) through the model, filling `cache`; returns the
    logits of the last position, (batch, vocab). key_mask: (batch, T) or longer (a mask over
    every slot of the cache), False on padding.
    Notebook 01 (KV cache)."""
    mask = _mask(model, tokens.shape[1], cache.length, key_mask)
    return model.logits(model(tokens, positions, cache, mask), at=-1)


@torch.inference_mode()
def decode_step(model, cache, next_tokens: torch.Tensor, positions=None, key_mask=None) -> torch.Tensor:
    """Feed one token per row (batch,) and return the next logits (batch, vocab).
    key_mask: (batch, cache.length + 1) or longer, False on padding. Notebook 01 (KV cache)."""
    mask = _mask(model, 1, cache.length, key_mask)
    return model.logits(model(next_tokens.unsqueeze(1), positions, cache, mask), at=-1)


def _eos_ids(model, eos_token_ids) -> list[int]:
    """The ids that end a row: the model's own, or the ones given (checked; () for none)."""
    if eos_token_ids is None:
        return list(model.config.eos_token_ids)
    return token_id_set(eos_token_ids)


def _pad_id(model, eos_ids: list[int]) -> int:
    """Padding is masked out, so any id the embedding has works; the first end-of-sequence id
    is customary, when it lies inside the vocabulary (small checkpoints' may not)."""
    return next((i for i in eos_ids if 0 <= i < model.config.vocab_size), 0)


def _eos_tensor(eos_ids: list[int], device) -> torch.Tensor:
    return torch.tensor(eos_ids, dtype=torch.long, device=device)


def _next_tokens(logits, sampling, generator, new_tokens: list, finished, counts, eos) -> torch.Tensor:
    """Pick each row's next token and do the bookkeeping: a finished row keeps repeating
    its end token and stops counting; `new_tokens`, `finished` and `counts` are updated."""
    next_tokens = sample(logits, sampling, generator)
    next_tokens = torch.where(finished, new_tokens[-1] if new_tokens else next_tokens, next_tokens)
    counts += ~finished
    new_tokens.append(next_tokens)
    finished |= torch.isin(next_tokens, eos)
    return next_tokens


# Steps between the host's checks that every row has finished. Each check waits for the GPU
# (bool() of a device tensor), which stalls its queue of kernels; a few extra steps after the
# last row ends cost less. On a CPU there is no queue to stall.
EOS_CHECK_EVERY = {"cuda": 8}
AUTO_COMPILE_MIN_TOKENS = 32      # fewer decode steps cannot pay back the compile and graph capture


def compile_by_default(device, max_new_tokens: int) -> bool:
    """Whether `generate(..., compile=None)` compiles its decode steps: on a CUDA GPU, for 32 new
    tokens or more (the default, compile=False, never does). Introduced in notebook 01 (KV cache).

    On a GPU a small model's decode step is bound by launching its few hundred kernels, and a
    CUDA graph replays them all in one launch; the warm-up (compile, then record the graph,
    seconds per shape bucket) is reported as `GenerationResult.warmup_seconds`. On a CPU
    compiling pays only for long generations, so it stays off unless asked (notebook 07).
    """
    return torch.device(device).type == "cuda" and max_new_tokens >= AUTO_COMPILE_MIN_TOKENS


def choose_decoder(compile, device, max_new_tokens: int, cache) -> CompiledDecoder | None:
    """The compiled decoder a `compile=` value asks for (None: eager steps), chosen once, before
    the loop: `generate`'s (notebook 01) and `speculative_generate`'s (notebook 05). compile:
    True (`compiled.SHARED`), False, None (`compile_by_default`) or a `CompiledDecoder`; cache:
    the cache passed in, or None. Anything else, or a cache without fixed-shape writes for a
    decoder, is refused in one sentence."""
    if isinstance(compile, CompiledDecoder):
        decoder = compile
    elif compile is None:
        wanted = compile_by_default(device, max_new_tokens) and (cache is None or cache.fixed_shape_writes)
        decoder = SHARED if wanted else None
    elif isinstance(compile, bool):
        decoder = SHARED if compile else None
    else:
        raise LabError(f"compile must be True, False, None (compile on a GPU) or a CompiledDecoder, "
                       f"got {compile!r}.")
    if decoder is not None and cache is not None and not cache.fixed_shape_writes:
        raise LabError(f"compile needs a cache with fixed-shape writes (a StaticKVCache), got a "
                       f"{type(cache).__name__}; pass compile=False or no cache.")
    return decoder


def generate(model, prompt, max_new_tokens: int = 32, sampling: SamplingConfig = GREEDY,
             eos_token_ids: Sequence[int] | None = None, stream: StreamCallback | None = None,
             return_logits: bool = False, compile: bool | CompiledDecoder | None = False,
             cache: KVCache | None = None) -> GenerationResult:
    """Generate with a KV cache: one prefill, then one decode step per token.

    prompt: ids as a list or 1-D tensor, a (batch, T) tensor, or a list of prompts of any
        lengths (left-padded into one batch; see batching.py, notebook 02).
    eos_token_ids: ids that end a row (default: the model's); pass () to never stop early.
    stream: called with each step's new tokens, (batch,), as soon as they exist.
    compile: run decode steps through a `CompiledDecoder` (compiled.py: fixed shapes rounded
        up to buckets, torch.compile, on CUDA also CUDA graphs): True uses `compiled.SHARED`,
        or pass your own decoder; None: `compile_by_default` (on a GPU, for 32 tokens or more).
        False (default): eager steps, so that every comparison in the course (against Hugging
        Face's eager generate(), speculative decoding, the serving engine) is eager against
        eager unless it names compiling on both sides (notebook 07, the bench's engines and
        compile sections). The result says what ran (`decode_path`, `warmup_seconds`, `compiles`, `cudagraph_skips`);
        where compiling fails, the steps run eagerly and `decode_note` (and a warning) says why.
    cache: an empty `KVCache` with one row per prompt and room for the longest prompt plus
        max_new_tokens (checked); default a new `StaticKVCache` of exactly that size, or the
        compiled decoder's cache for the shape's bucket.
    """
    device = model.device
    rows = token_rows(prompt, model.config.vocab_size)
    eos_ids = _eos_ids(model, eos_token_ids)
    pad_id = _pad_id(model, eos_ids)
    padded = left_pad(rows, pad_id=pad_id, device=device)
    batch, prompt_length = padded.tokens.shape
    max_new_tokens = require_fits_context(model, prompt_length, max_new_tokens)
    eos = _eos_tensor(eos_ids, device)
    generator = require_sampling(sampling).generator(device)
    needed = prompt_length + max_new_tokens
    if cache is not None:
        require_fitting_cache(cache, batch, needed, model)
    decoder = choose_decoder(compile, device, max_new_tokens, cache)
    if cache is None:
        cache = (decoder.cache_for(model, batch, needed) if decoder is not None
                 else StaticKVCache.for_model(model, batch, needed))
    path = decoder.warm_up(model, cache) if decoder is not None else DecodePath()     # before any timing
    step = decoder.step if path.compiled else decode_step      # the compiled one adds its bucket's rows itself
    # Without padding the model's defaults (positions from the cache, causal mask) are exact
    # and fastest. With padding: a mask over every cache slot, and per-row positions.
    key_mask = padded_key_mask(padded.attention_mask, cache.max_len) if padded.is_padded else None  # (batch, max_len)
    positions = padded.positions[:, -1:] if padded.is_padded else None                              # (batch, 1)
    synchronize(device)
    t0 = time.perf_counter()
    logits = prefill(model, padded.tokens, cache, positions=padded.positions if padded.is_padded else None,
                     key_mask=key_mask)
    graphs_before = graphs_compiled()
    new_tokens, all_logits = [], []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    counts = torch.zeros(batch, dtype=torch.long, device=device)
    t1 = None
    check_every = EOS_CHECK_EVERY.get(device.type, 1) if stream is None else 1     # streaming shows each step
    for index in range(max_new_tokens):
        if return_logits:
            all_logits.append(logits.float().cpu())
        next_tokens = _next_tokens(logits, sampling, generator, new_tokens, finished, counts, eos)
        if stream is not None:
            stream(next_tokens)
        if t1 is None:
            synchronize(device)
            t1 = time.perf_counter()
        if index == max_new_tokens - 1 or ((index + 1) % check_every == 0 and bool(finished.all())):
            break
        positions = None if positions is None else positions + 1
        logits = step(model, cache, next_tokens, positions, key_mask)
    synchronize(device)
    t2 = time.perf_counter()
    if path.compiled and graphs_compiled() > graphs_before:     # never silent: said, and counted
        path = recompiled(path, graphs_compiled() - graphs_before)
    counts = counts.tolist()
    tokens = torch.stack(new_tokens, dim=1)[:, :max(counts)]         # steps after the last row ended
    return GenerationResult(tokens=tokens, prompt_length=prompt_length,
                            new_token_counts=counts, prefill_seconds=t1 - t0,
                            decode_seconds=t2 - t1, logits=all_logits[:max(counts)],
                            path=path)


@torch.inference_mode()
def generate_naive(model, prompt, max_new_tokens: int = 32, sampling: SamplingConfig = GREEDY,
                   eos_token_ids: Sequence[int] | None = None,
                   return_logits: bool = False) -> GenerationResult:
    """The handbook chapter's loop: no cache, the whole sequence re-run every step.

    Same interface and (for the same seed) the same tokens as `generate`; use it
    only to see why the cache matters. Batch 1 or equal-length prompts.

    Notebook 01 (KV cache).
    """
    device = model.device
    rows = token_rows(prompt, model.config.vocab_size)
    if len({len(row) for row in rows}) > 1:
        raise LabError("generate_naive takes one prompt, or prompts of equal length; "
                       "use generate for a padded batch.")
    sequence = torch.tensor(rows, dtype=torch.long, device=device)        # (batch, T)
    batch, prompt_length = sequence.shape
    max_new_tokens = require_fits_context(model, prompt_length, max_new_tokens)
    eos = _eos_tensor(_eos_ids(model, eos_token_ids), device)
    generator = require_sampling(sampling).generator(device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    counts = torch.zeros(batch, dtype=torch.long, device=device)
    new_tokens, all_logits = [], []
    synchronize(device)
    t0 = time.perf_counter()
    for step in range(max_new_tokens):
        logits = model.logits(model(sequence), at=-1)                   # (batch, vocab)
        if return_logits:
            all_logits.append(logits.float().cpu())
        next_tokens = _next_tokens(logits, sampling, generator, new_tokens, finished, counts, eos)
        sequence = torch.cat([sequence, next_tokens.unsqueeze(1)], dim=1)   # (batch, T + step + 1)
        if bool(finished.all()):
            break
    synchronize(device)
    elapsed = time.perf_counter() - t0
    return GenerationResult(tokens=torch.stack(new_tokens, dim=1), prompt_length=prompt_length,
                            new_token_counts=counts.tolist(), prefill_seconds=0.0,
                            decode_seconds=elapsed, logits=all_logits)
