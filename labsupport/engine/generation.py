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
from contextlib import contextmanager
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .padding import left_pad
from ..errors import LabError, first_line
from .hardware import synchronize
from ..inputs import token_id_set, token_rows, whole_number
from .kv_cache import KVCache, StaticKVCache, require_fitting_cache
from .models.masks import padded_key_mask
from .sampling import GREEDY, SamplingConfig, sample

StreamCallback = Callable[[torch.Tensor], None]


@dataclass
class GenerationResult:
    """What `generate` returns. tokens: (batch, new_tokens) generated ids; rows that
    finished early are padded after their end-of-sequence token with that token. Notebook 01 (KV cache)."""

    tokens: torch.Tensor
    prompt_length: int
    new_token_counts: list[int]
    prefill_seconds: float
    decode_seconds: float
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)
    warmup_seconds: float = 0.0       # compiling and recording the decode step (first use of a shape)

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


def _check_sampling(sampling) -> SamplingConfig:
    if not isinstance(sampling, SamplingConfig):
        raise LabError(f"sampling must be a SamplingConfig (e.g. SamplingConfig(temperature=0.8, seed=0)), "
                       f"got {type(sampling).__name__}.")
    return sampling


@torch.inference_mode()
def prefill(model, tokens: torch.Tensor, cache, positions=None, key_mask=None) -> torch.Tensor:
    """Run the prompt (batch, T) through the model, filling `cache`; returns the
    logits of the last position, (batch, vocab). Notebook 01 (KV cache)."""
    return model(tokens, cache=cache, positions=positions, key_mask=key_mask, last_only=True)[:, -1]


@torch.inference_mode()
def decode_step(model, cache, next_tokens: torch.Tensor, positions=None, key_mask=None) -> torch.Tensor:
    """Feed one token per row (batch,) and return the next logits (batch, vocab). Notebook 01 (KV cache)."""
    return model(next_tokens.unsqueeze(1), cache=cache, positions=positions,
                 key_mask=key_mask)[:, -1]


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
    """Whether `generate` compiles its decode steps when not told: on a CUDA GPU, for 32 new
    tokens or more. Introduced in notebook 01 (KV cache).

    On a GPU a small model's decode step is bound by launching its few hundred kernels, and a
    CUDA graph replays them all in one launch; the warm-up (compile, then record the graph,
    seconds per batch shape) is reported as `GenerationResult.warmup_seconds`. On a CPU
    compiling pays only for long generations, so it stays off unless asked (notebook 07).
    """
    return torch.device(device).type == "cuda" and max_new_tokens >= AUTO_COMPILE_MIN_TOKENS


def generate(model, prompt, max_new_tokens: int = 32, sampling: SamplingConfig = GREEDY,
             eos_token_ids: Sequence[int] | None = None, stream: StreamCallback | None = None,
             return_logits: bool = False, compile: bool | None = None,
             cache: KVCache | None = None) -> GenerationResult:
    """Generate with a KV cache: one prefill, then one decode step per token.

    prompt: ids as a list or 1-D tensor, a (batch, T) tensor, or a list of prompts of any
        lengths (left-padded into one batch; see batching.py, notebook 02).
    eos_token_ids: ids that end a row (default: the model's); pass () to never stop early.
    stream: called with each step's new tokens, (batch,), as soon as they exist.
    compile: run decode steps through `compiled_decode` (fixed shapes, torch.compile;
        on CUDA also captured as CUDA graphs). None (default): `compile_by_default`, on a
        GPU only. Where compiling fails (no compiler, an unsupported GPU), the steps run
        eagerly after one warning sentence, and that model is not compiled again.
    cache: an empty `KVCache` with one row per prompt and room for the longest prompt plus
        max_new_tokens (checked); default a new `StaticKVCache` of exactly that size.
    """
    device = model.device
    rows = token_rows(prompt, model.config.vocab_size)
    eos_ids = _eos_ids(model, eos_token_ids)
    padded = left_pad(rows, pad_id=_pad_id(model, eos_ids), device=device)
    batch, prompt_length = padded.tokens.shape
    max_new_tokens = require_fits_context(model, prompt_length, max_new_tokens)
    eos = _eos_tensor(eos_ids, device)
    generator = _check_sampling(sampling).generator(device)
    if cache is None:
        cache = StaticKVCache.for_model(model, batch, prompt_length + max_new_tokens)
    else:
        require_fitting_cache(cache, batch, prompt_length + max_new_tokens, model)
    if compile is None:
        compile = (compile_by_default(device, max_new_tokens) and hasattr(cache, "writer_at")
                   and getattr(model, "_compile_failed", None) is None)
    if compile and not hasattr(cache, "writer_at"):
        raise LabError(f"compile=True needs a cache with fixed-shape writes (a StaticKVCache), "
                       f"got a {type(cache).__name__}; pass compile=False or no cache.")
    # Without padding the model's defaults (positions from the cache, no mask) are exact
    # and fastest. With padding: a mask over every cache slot, and per-row positions.
    key_mask = positions = None
    if padded.is_padded:
        key_mask = padded_key_mask(padded.attention_mask, cache.max_len)  # (batch, max_len)
        positions = padded.positions[:, -1:]                              # (batch, 1)

    synchronize(device)
    t0 = time.perf_counter()
    logits = prefill(model, padded.tokens, cache, positions=padded.positions if padded.is_padded else None,
                     key_mask=key_mask[:, :prompt_length] if padded.is_padded else None)
    new_tokens, all_logits = [], []
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    counts = torch.zeros(batch, dtype=torch.long, device=device)
    t1, warmup = None, 0.0
    check_every = EOS_CHECK_EVERY.get(device.type, 1) if stream is None else 1     # streaming shows each step
    for step in range(max_new_tokens):
        if return_logits:
            all_logits.append(logits.float().cpu())
        next_tokens = _next_tokens(logits, sampling, generator, new_tokens, finished, counts, eos)
        if stream is not None:
            stream(next_tokens)
        if t1 is None:
            synchronize(device)
            t1 = time.perf_counter()
        if step == max_new_tokens - 1 or ((step + 1) % check_every == 0 and bool(finished.all())):
            break
        if positions is not None:
            positions = positions + 1
        step_mask = key_mask[:, : cache.length + 1] if key_mask is not None else None
        if compile:
            logits, seconds = _compiled_step_or_none(model, cache, next_tokens, positions, key_mask)
            warmup += seconds
            compile = logits is not None
        if not compile:
            logits = decode_step(model, cache, next_tokens, positions=positions, key_mask=step_mask)
    synchronize(device)
    t2 = time.perf_counter()
    counts = counts.tolist()
    tokens = torch.stack(new_tokens, dim=1)[:, :max(counts)]         # steps after the last row ended
    return GenerationResult(tokens=tokens, prompt_length=prompt_length,
                            new_token_counts=counts, prefill_seconds=t1 - t0,
                            decode_seconds=t2 - t1, logits=all_logits[:max(counts)], warmup_seconds=warmup)


def _compiled_step_or_none(model, cache, next_tokens, positions, key_mask) -> tuple[torch.Tensor | None, float]:
    """One compiled decode step and the seconds it spent warming up (0 once this shape is warm);
    (None, 0) after a warning when compiling fails here, so that `generate` goes on eagerly."""
    shape = (next_tokens.shape[0], cache.max_len, key_mask is not None)
    start = time.perf_counter()
    try:
        compiled_decode(model)                  # (re)built first: new options warm up again
        warm = shape in getattr(model, "_compiled_shapes", set())
        logits = compiled_step(model, cache, next_tokens, positions, key_mask)
    except Exception as error:                   # noqa: BLE001 - any failure: decode eagerly instead
        reason = first_line(error)
        model._compile_failed = reason
        warnings.warn(f"Compiled decoding is not available here ({reason}); decoding without it.", stacklevel=3)
        return None, 0.0
    if warm:
        return logits, 0.0
    synchronize(logits.device)
    model._compiled_shapes = getattr(model, "_compiled_shapes", set()) | {shape}
    return logits, time.perf_counter() - start


# Inductor's options for the compiled decode step, per device type (torch._inductor.config names):
# "freezing" folds the weights into the graph as constants (on a CPU, linear layers then use
# prepacked oneDNN weights), "cpp_wrapper" calls the step's kernels from generated C++ instead of
# Python. Empty: inductor's defaults. The compile bench section measures the variants
# (`inductor_options` switches them for a while).
INDUCTOR_OPTIONS: dict[str, dict] = {"cpu": {}, "cuda": {}}


@contextmanager
def inductor_options(options: dict):
    """Compile decode steps made inside the with-block with these inductor `options`.
    Introduced in notebook 07 (putting it together), for the compile bench section."""
    device_types = list(INDUCTOR_OPTIONS)
    saved = {k: INDUCTOR_OPTIONS[k] for k in device_types}
    INDUCTOR_OPTIONS.update(dict.fromkeys(device_types, dict(options)))
    try:
        yield
    finally:
        INDUCTOR_OPTIONS.update(saved)


def compiled_decode(model):
    """`model.decode_static` through torch.compile, built once per model (and per set of
    `INDUCTOR_OPTIONS` for its device).

    On CUDA the mode is "reduce-overhead", which also captures the step as a CUDA
    graph: one launch replays every kernel of the step, removing the per-kernel
    launch cost that dominates a small model's decode step on a fast GPU.

    Notebooks 03 and 07 point to it (`generate(..., compile=True)`) for a fast GPU.
    """
    options = INDUCTOR_OPTIONS.get(model.device.type, {})
    key = tuple(sorted(options.items()))
    if getattr(model, "_compiled_decode", None) is None or getattr(model, "_compiled_key", None) != key:
        # torch.compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, ...):
        # "reduce-overhead" records the step as a CUDA graph (torch 2.13's docs), which replays fixed
        # device addresses: so the step must see the same tensors every call. decode_static takes the
        # StaticKVCache's preallocated buffers, a fixed-shape mask (masks.fixed_decode_mask) and the
        # write slot as a tensor, so nothing changes shape or address between steps; dynamic=False
        # compiles one graph per batch size. The first calls compile and record (the warm-up); the
        # logits are cloned out of the graph's output buffer (`compiled_step`) before the next replay.
        # torch.compile takes mode or options, not both.
        mode = "reduce-overhead" if model.device.type == "cuda" and not options else None
        model._compiled_decode = torch.compile(model.decode_static, mode=mode, dynamic=False,
                                               options=dict(options) or None)
        model._compiled_key = key
        model._compiled_shapes = set()                  # a new compile warms up again
    return model._compiled_decode


@torch.inference_mode()
def compiled_step(model, cache, next_tokens: torch.Tensor, positions=None, key_mask=None) -> torch.Tensor:
    """One decode step through `compiled_decode`, writing at `cache.length`; returns logits
    (batch, vocab), copied out of the compiled step's buffers. Introduced in notebook 07."""
    slot = torch.full((1,), cache.length, dtype=torch.long, device=next_tokens.device)
    if positions is None:
        positions = slot.expand(next_tokens.shape[0], 1)                 # (batch, 1)
    logits = compiled_decode(model)(next_tokens.unsqueeze(1), positions, cache, slot, key_mask)
    cache.advance(1)
    return logits.clone()


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
    generator = _check_sampling(sampling).generator(device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    counts = torch.zeros(batch, dtype=torch.long, device=device)
    new_tokens, all_logits = [], []
    synchronize(device)
    t0 = time.perf_counter()
    for step in range(max_new_tokens):
        logits = model(sequence, last_only=True)[:, -1]                 # (batch, vocab)
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


# --- text in, text out ----------------------------------------------------------------

def chat_prompt(tokenizer, message: str, system: str | None = None) -> str:
    """The instruct model's chat template around one user message (plain text if it has none).
    Notebooks 02 and 05."""
    if getattr(tokenizer, "chat_template", None) is None:
        return message
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class TextStreamer:
    """A `stream` callback that prints text as it is generated (batch 1).

    It decodes everything so far and prints only what is new, so that tokens
    that are parts of one character or word print correctly.

    It streams notebook 01's `generate` (`generate_text(..., stream=True)`: the README's first example).
    """

    def __init__(self, tokenizer, print_fn=None):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.printed = ""
        self.print_fn = print_fn or (lambda text: print(text, end="", flush=True))

    def __call__(self, next_tokens: torch.Tensor) -> None:
        self.ids.append(int(next_tokens[0]))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return                      # half of a multi-byte character: wait for the rest
        self.print_fn(text[len(self.printed):])
        self.printed = text


def generate_text(model, tokenizer, message: str, max_new_tokens: int = 64,
                  sampling: SamplingConfig = GREEDY, chat: bool = True, system: str | None = None,
                  stream: bool = False) -> str:
    """Reply to `message` (inside the chat template when `chat`), optionally printing as it goes.
    Text in, text out around notebook 01's `generate` (the README's first example)."""
    text = chat_prompt(tokenizer, message, system) if chat else message
    ids = tokenizer.encode(text, add_special_tokens=False)
    eos = set(model.config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    result = generate(model, ids, max_new_tokens, sampling, eos_token_ids=sorted(eos),
                      stream=TextStreamer(tokenizer) if stream else None)
    return tokenizer.decode(result.row(0), skip_special_tokens=True)
