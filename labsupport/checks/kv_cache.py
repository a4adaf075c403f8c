"""Checkers for notebook 01 (KV cache): `check_cache_update` (one layer's new keys and values stored
in place, everything cached so far returned), `check_cached_generation` (the cached greedy loop must
give the uncached loop's tokens and logits, one pass per token), `check_tokens_that_fit` and
`check_cache_size` (the bytes a KV cache needs, turned around or not).

Introduced in notebook 01 (KV cache). Each compares with the package's reference (`StaticKVCache.write`,
`generate_naive`, `kv_cache_bytes`) on inputs where each typical mistake gives another answer, and names
the mistake in its hint. Each grades by reach (`grading.graded`, its `Exercise`): the engine's writes,
cached loop and byte counts are refused.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from ..engine.generation import generate_naive
from ..engine.kv_cache import StaticKVCache, kv_cache_bytes
from ..engine.config import PRESETS, ModelConfig
from ..weights.fixtures import random_model
from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded
from .roofline import WIDE_HEADS

UPDATE = "cache update of one attention layer"
GENERATION = "cached greedy generation"
SIZE = "KV cache size"


def tiny_test_model(name: str, dtype: torch.dtype = torch.float64, scale: float = 10.0):
    """A tiny preset ("tiny-llama", "tiny-gpt2") with `scale` x `random_model`'s weights, so that its greedy
    tokens depend on the whole context (small weights repeat one token, which would let a wrong mask or
    position pass); float64 keeps batched and lone runs equal. Notebooks 01 (KV cache) and 02 (batching)."""
    model = random_model(name, seed=0, dtype=dtype)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "norm" not in parameter_name:
                parameter.mul_(scale)
    return model


# --- exercise 1: the cache update of one layer ------------------------------------------------

# (batch, kv_heads, max_len, head_dim, length already cached, new tokens T): a prefill first,
# then decode steps; kv_heads != T in the cases with T > 1, so the two cannot be confused
UPDATE_CASES = [(1, 3, 16, 8, 0, 5), (1, 3, 16, 8, 5, 1), (2, 2, 12, 4, 7, 3), (1, 1, 8, 4, 7, 1)]


def _one_layer_cache(batch: int, kv_heads: int, max_len: int, head_dim: int) -> StaticKVCache:
    """A reference StaticKVCache with a single layer of the given shape."""
    return StaticKVCache(ModelConfig(family="llama", vocab_size=8, hidden_size=kv_heads * head_dim, num_layers=1,
                                     num_heads=kv_heads, num_kv_heads=kv_heads, intermediate_size=8,
                                     max_position=max_len), batch, max_len)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _shape_hint(got: torch.Tensor, length: int, T: int, max_len: int) -> str:
    """Name the slip from the length of the returned sequence dimension."""
    returned = got.shape[2] if isinstance(got, torch.Tensor) and got.dim() == 4 else None
    if returned == T and length > 0:
        return "return every position cached so far (0 .. length + T - 1), not only the new ones."
    if returned == length + 1 and T > 1:
        return "a prefill brings T > 1 new tokens at once: T = new_keys.shape[2]."
    if returned == length:
        return "the returned keys must include the new ones: cut the buffer at length + T."
    if returned == max_len:
        return "cut the buffer at length + T: the slots after it are empty (buffer[:, :, :length + T])."
    return "return the buffers up to the end of the new tokens: buffer[:, :, :length + T]; the sequence is dimension 2."


def _check_one_update(fn, batch, kv_heads, max_len, head_dim, length, T, generator) -> None:
    reference = _one_layer_cache(batch, kv_heads, max_len, head_dim)
    # earlier tokens are already in the buffers (written as one pass of `length`); the rest holds zeros
    earlier = [torch.randn(batch, kv_heads, length, head_dim, generator=generator) for _ in range(2)]
    if length:
        reference.reserve(length).update(0, *earlier)
    key_buffer, value_buffer = reference.keys[0].clone(), reference.values[0].clone()
    new_k = torch.randn(batch, kv_heads, T, head_dim, generator=generator)   # (batch, kv_heads, T, head_dim)
    new_v = torch.randn(batch, kv_heads, T, head_dim, generator=generator)
    want_k, want_v = reference.reserve(T).update(0, new_k, new_v)            # (batch, kv_heads, length+T, head_dim)
    case = f"(length={length}, T={T}, buffers {tuple(key_buffer.shape)})"

    out = call_learner(UPDATE, f"a result {case}",
                       "T = new_keys.shape[2] (the sequence is dimension 2 of (batch, kv_heads, T, head_dim)); "
                       "write key_buffer[:, :, length:length + T] = new_keys.",
                       fn, key_buffer, value_buffer, new_k.clone(), new_v.clone(), length)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        fail(UPDATE, "a pair (keys so far, values so far)", type(out).__name__,
             "end the function with `return keys, values`.")
    got_k, got_v = out
    if not torch.equal(key_buffer, reference.keys[0]) or not torch.equal(value_buffer, reference.values[0]):
        if torch.equal(got_k, want_k) and torch.equal(got_v, want_v):
            fail(UPDATE, f"the new keys/values written into the buffers {case}",
                 "the right result but unchanged buffers",
                 "store in place with slice assignment, key_buffer[:, :, start:end] = new_keys; "
                 "torch.cat makes a new tensor, so the next step would not find them.")
        if not torch.equal(key_buffer[:, :, :length], reference.keys[0, :, :, :length]):
            fail(UPDATE, f"the {length} tokens already cached left as they were {case}",
                 "them overwritten", "write only positions length .. length + T - 1: the first free "
                 "position is `length`.")
        if T > 1 and torch.equal(key_buffer[:, :, length], new_k[:, :, 0]):
            fail(UPDATE, f"all {T} new keys at positions {length}..{length + T - 1} {case}",
                 "only the first one", "a prefill brings T > 1 new tokens at once: T = new_keys.shape[2].")
        written_at = [p for p in range(max_len - T + 1) if torch.equal(key_buffer[:, :, p:p + T], new_k)]
        fail(UPDATE, f"the new keys at positions {length}..{length + T - 1} {case}",
             f"them at position(s) {written_at}" if written_at else "other values there",
             "the first free position is `length`: key_buffer[:, :, length:length + T] = new_keys.")
    if not isinstance(got_k, torch.Tensor) or got_k.shape != want_k.shape or got_v.shape != want_v.shape:
        fail(UPDATE, f"keys and values of shape {tuple(want_k.shape)} {case}",
             f"{_shape(got_k)} and {_shape(got_v)}", _shape_hint(got_k, length, T, max_len))
    if torch.equal(got_k, want_v) and torch.equal(got_v, want_k) and T > 0:
        fail(UPDATE, "keys first, then values", "them swapped", "return (keys, values) in that order.")
    if not (torch.equal(got_k, want_k) and torch.equal(got_v, want_v)):
        fail(UPDATE, f"the returned keys/values to equal the buffers' first {length + T} positions {case}",
             "different values", "return key_buffer[:, :, :length + T] and value_buffer[:, :, :length + T].")


ENGINE = "labsupport.engine."
# the engine's caches and writers do this write (the walk does not see a method read off an object the
# learner builds, so the classes themselves are refused)
CACHE_UPDATE = Exercise(UPDATE, "the in-place write of one layer's new keys and values into its preallocated "
                                "buffers, and the keys and values cached so far", computed_by=tuple(
    ENGINE + path for path in ("kv_cache.StaticKVCache", "kv_cache.StaticKVCache.write", "kv_cache.PassWriter",
                               "kv_cache.PassWriter.update", "kv_cache.FixedShapeWriter",
                               "kv_cache.FixedShapeWriter.update", "kv_quant.Int8KVCache", "kv_quant.Int8KVCache.write")))


@grades_quietly
@graded(CACHE_UPDATE)
def check_cache_update(fn) -> None:
    """Check fn(key_buffer, value_buffer, new_keys, new_values, length) -> (keys, values).
    Introduced in notebook 01 (KV cache). Buffers (batch, kv_heads, max_len, head_dim), new keys/values
    (batch, kv_heads, T, head_dim), `length` positions filled: fn stores the new ones at [length, length + T)
    in place and returns positions [0, length + T). The cases: a prefill (T = 5) into an empty cache, decode
    steps after earlier tokens, a batch of 2, a cache filled to its last slot. Graded by reach (`CACHE_UPDATE`).
    """
    generator = torch.Generator().manual_seed(1)
    for case in UPDATE_CASES:
        _check_one_update(fn, *case, generator)
    passed(UPDATE, f"{len(UPDATE_CASES)} cases agree with StaticKVCache.write.")


# --- exercise 2: the cached greedy loop ---------------------------------------------------------

class CountingModel:
    """The model, recording every forward pass: the tokens (and rows) fed, the positions given (by name
    or in place) and the rows of the cache written: whether the cache is really used
    (`check_cached_generation`), whether the prompts went through as one batch
    (`batching.check_batched_generation`). Notebook 01 (KV cache)."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, tokens, *args, **kwargs):
        positions = kwargs.get("positions", args[0] if args else None)
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        self.calls.append({"tokens": tokens.shape[-1], "rows": tokens.shape[0] if tokens.dim() > 1 else 1,
                           "positions": positions, "shape": tuple(tokens.shape),
                           "cache_rows": getattr(cache, "batch_size", None)})
        return self.model(tokens, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):                    # config, device, dtype, ...: the model's own
        return getattr(self.model, name)


GENERATION_PROMPT = [5, 17, 42, 99, 3, 250, 7]
FEED_ONE = "after the prefill feed only the token just picked, shape (1, 1), with the same cache."


def _generation_hint(calls: list[dict], got_ids: list[int], want_ids: list[int]) -> str:
    """Name the slip from the calls the learner's loop made and the first step that went wrong."""
    step = next((i for i, want in enumerate(want_ids) if i >= len(got_ids) or got_ids[i] != want), 0)
    if step == 0:
        return ("the first new token comes from the prefill's logits at the prompt's last position: "
                "model.logits(model(prompt, cache=cache), at=-1).")
    if any(c["positions"] is not None for c in calls[1:]):
        return ("positions continue from the cache: leave `positions` out (the model counts on from "
                "cache.length) instead of starting again at 0.")
    if any(c["tokens"] != 1 for c in calls[1:]):
        return FEED_ONE
    return ("each step feeds the token it has just picked (the argmax of the latest logits) "
            "and appends it, in that order.")


def _failure_hint(error: Exception, calls: list[dict]) -> str:
    """Name the slip behind an error raised inside the learner's loop."""
    if len(calls) > 1 and calls[1]["tokens"] > 1:
        return FEED_ONE
    if isinstance(error, LabError):
        return "make the cache hold the prompt and every new token: max_len = len(prompt_ids) + new_tokens."
    if "dtype" in str(error) or "device" in str(error):
        return "create the cache as StaticKVCache(model.config, 1, max_len, device=model.device, dtype=model.dtype)."
    return ("prefill: logits = model.logits(model(prompt (1, T), cache=cache), at=-1); each step: "
            "model.logits(model(next token (1, 1), cache=cache), at=-1).")


def _require_the_method(calls: list[dict], prompt: list[int], new_tokens: int, case: str) -> None:
    """The method: a cache of one row; one pass for the whole prompt, then one pass of one token for each
    later token (the last token's logits come from the pass before it, so it needs none of its own)."""
    fed = [c["tokens"] for c in calls]
    if len(fed) > 1 and fed[1] > 1 and all(b > a for a, b in zip(fed, fed[1:])):
        fail(GENERATION, "one token per forward pass after the prefill", f"passes of {fed[:4]}... tokens",
             "the cache is not used: after the prefill feed only the newest token and let the cache supply the rest.")
    if fed and fed[0] != len(prompt):
        fail(GENERATION, f"one prefill of the whole prompt ({len(prompt)} tokens) first", f"a first pass of "
             f"{fed[0]} token(s)", "run the whole prompt through the model once (the prefill), then one token per step.")
    rows = sorted({c["cache_rows"] for c in calls} - {None, 1})
    if rows:
        fail(GENERATION, f"a cache of one row (one sequence) {case}", f"a cache of {rows[0]} rows",
             "StaticKVCache(model.config, batch_size=1, ...): any other row holds max_len positions nothing uses.")
    if len(calls) != new_tokens:
        fail(GENERATION, f"{new_tokens} forward passes for {new_tokens} new tokens (one prefill, then one per "
                         f"later token) {case}", f"{len(calls)} passes",
             "the prefill's logits give the first token and each pass gives the next one, so the last token "
             "needs no pass: feed a token only while another one is to come (step < new_tokens - 1).")


def _check_one_generation(fn, model, prompt: list[int], new_tokens: int, name: str) -> None:
    want = generate_naive(model, prompt, new_tokens, eos_token_ids=(), return_logits=True)
    want_ids, want_logits = want.tokens[0].tolist(), torch.cat(want.logits)        # (new_tokens, vocab)
    counting = CountingModel(model)
    case = f"on {name}, a {len(prompt)}-token prompt, {new_tokens} new tokens"
    with torch.inference_mode():
        out = call_learner(GENERATION, f"the loop to run {case}",
                           lambda error: _failure_hint(error, counting.calls), fn, counting, list(prompt), new_tokens)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        fail(GENERATION, "a pair (new ids, logits of every step)", type(out).__name__,
             "end with `return new_ids, torch.cat(step_logits)`.")
    try:
        got_ids, got_logits = [int(t) for t in out[0]], torch.as_tensor(out[1]).detach().float().cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        fail(GENERATION, "a list of token ids and a tensor of logits", f"{type(error).__name__}: {error}",
             "return the new ids as a list of ints and torch.cat(step_logits), as generate_without_cache does.")
    _require_the_method(counting.calls, prompt, new_tokens, case)
    if got_ids != want_ids:
        fail(GENERATION, f"the uncached loop's tokens {want_ids} {case}", got_ids,
             _generation_hint(counting.calls, got_ids, want_ids))
    if got_logits.numel() != want_logits.numel():
        fail(GENERATION, f"logits of shape {tuple(want_logits.shape)} (new_tokens, vocab)",
             f"shape {tuple(got_logits.shape)}", "keep each step's logits (1, vocab) and torch.cat them.")
    got_logits = got_logits.reshape(want_logits.shape)
    if not torch.allclose(got_logits, want_logits.float(), atol=2e-3, rtol=1e-3):
        sums_to_one = torch.allclose(got_logits.sum(-1), torch.ones(len(want_ids)), atol=1e-3)
        fail(GENERATION, f"the uncached loop's logits {case}", "other numbers",
             "return the raw logits, not probabilities (no softmax)." if sums_to_one else
             "logits[i] must be the scores the i-th new token was picked from (the prefill's for i = 0).")


MODEL = ENGINE + "models.transformer.Transformer"
# the engine's cached loops, whole or in steps, and what runs them (a draft, the serving engine)
CACHED_LOOP = Exercise(
    GENERATION, "the greedy loop with a KV cache: one prefill of the prompt, then one pass of one token per new token",
    computed_by=tuple(ENGINE + path for path in (
        "generation.generate", "generation.generate_naive", "generation.prefill", "generation.decode_step",
        "speculative.speculative_generate", "compiled.CompiledDecoder.step", "compiled.fixed_shape_step",
        "drafts.ModelDraft.propose", "serving.engine.Engine.run", "serving.engine.Engine.step")),
    receives=(MODEL,),
    # one forward pass and its logits are the loop's building blocks; the cache goes on the model's device
    allowed=tuple(f"{MODEL}.{name}" for name in ("forward", "logits", "device", "dtype")))


@grades_quietly
@graded(CACHED_LOOP)
def check_cached_generation(fn, model=None, prompt_ids=None, new_tokens: int = 8) -> None:
    """Check fn(model, prompt_ids, new_tokens) -> (new_ids, logits (new_tokens, vocab)): the uncached loop's
    tokens and logits, with one prefill and one token per pass (`_require_the_method`).
    Introduced in notebook 01 (KV cache). Runs on two tiny models (rotary and learned positions: a position
    restarted at 0 shows in both), then on the notebook's model and prompt if given. Graded by reach (`CACHED_LOOP`).
    """
    cases = [(tiny_test_model(name), GENERATION_PROMPT, 6, name) for name in ("tiny-llama", "tiny-gpt2")]
    if model is not None:
        cases.append((model, list(prompt_ids), new_tokens, model.config.name))
    for case in cases:
        _check_one_generation(fn, *case)
    passed(GENERATION, f"same tokens and logits as the loop without a cache on {', '.join(c[3] for c in cases)}, "
                       "with one prefill and one token per step.")


# --- exercise 3: the size of a cache -----------------------------------------------------------

BYTES_TO_DTYPE = {4: torch.float32, 2: torch.float16, 1: torch.int8}
# WIDE_HEADS (roofline.py, Qwen3-0.6B's shapes): only wide heads tell head_dim from hidden_size // num_heads
SIZE_CASES = [(PRESETS["smollm2-135m"], 1024, 1, 4), (PRESETS["smollm2-135m"], 512, 8, 2),
              (PRESETS["gpt2"], 1000, 2, 4), (PRESETS["llama-7b-shape"], 4096, 1, 2),
              (PRESETS["tiny-llama"], 7, 3, 1), (WIDE_HEADS, 300, 2, 2)]


def _formula(c: ModelConfig, length: int, batch: int, bytes_per_value: int, sides: int = 2,
             heads: int | None = None, head_dim: int | None = None, layers: int | None = None) -> int:
    """layers x sides x heads x head_dim x length x batch x bytes, the config's own unless overridden."""
    heads = c.num_kv_heads if heads is None else heads
    head_dim = c.head_dim if head_dim is None else head_dim
    layers = c.num_layers if layers is None else layers
    return layers * sides * heads * head_dim * length * batch * bytes_per_value


# The typical slips, each as the formula it computes: their answers differ from each other on SIZE_CASES.
SIZE_MISTAKES = [
    (lambda c, n, b, by: _formula(c, n, b, by, sides=1), "keys AND values are cached: multiply by 2."),
    (lambda c, n, b, by: _formula(c, n, b, by, heads=c.num_heads),
     "use num_kv_heads, not num_heads: with grouped-query attention several query heads share one key/value head."),
    (lambda c, n, b, by: _formula(c, n, b, by, heads=1, head_dim=c.hidden_size),
     "use num_kv_heads x head_dim per token and layer, not hidden_size (that counts the query heads)."),
    (lambda c, n, b, by: _formula(c, n, b, by, head_dim=c.hidden_size // c.num_heads),
     "use config.head_dim: some models' heads are wider than hidden_size / num_heads (qwen3-0.6b-shape: 128, not 64)."),
    (lambda c, n, b, by: _formula(c, n, b, by, layers=1), "every layer has its own cache: multiply by num_layers."),
    (lambda c, n, b, by: _formula(c, n, b, 1), "multiply by bytes_per_value to turn values into bytes."),
    (lambda c, n, b, by: _formula(c, n, 1, by), "every sequence of the batch has its own cache: multiply by batch."),
    (lambda c, n, b, by: _formula(c, 1, b, by), "every position is cached: multiply by the length."),
    (lambda c, n, b, by: 8 * _formula(c, n, b, by), "the answer is in bytes, not bits."),
]


def _grade_formula(name, fn, cases, reference, mistakes, *, asked, bad_answer, fallback, describe) -> None:
    """Grade fn on every case against reference(*case); a wrong answer is matched against each slip of
    `mistakes` ([(formula, hint)]) over all the cases, to name the slip. asked(config): what fn returns;
    bad_answer: (test, hint) for a wrong kind of answer; describe(case, want) words the expected one."""
    answers, first_wrong = [], None
    for case in cases:
        want = reference(*case)
        got = call_learner(name, asked(case[0]), "use the config's fields num_layers, num_kv_heads and head_dim.",
                           fn, *case)
        answers.append(got)
        if got != want and first_wrong is None:
            first_wrong = (case, want, got)
    if first_wrong is None:
        passed(name, f"{len(cases)} cases agree with the reference.")
        return
    (case, want, got), (is_bad, bad_hint) = first_wrong, bad_answer
    hint = bad_hint if is_bad(got) else next(
        (hint for formula, hint in mistakes if all(answer == formula(*c) for answer, c in zip(answers, cases))), fallback)
    fail(name, describe(case, want), f"{got!r}", hint)


def _cache_bytes_exercise(title: str, teaches: str) -> Exercise:
    """The cache-size exercises' declaration: the engine's byte counts, a cache's allocation (the classes:
    the walk does not see `.nbytes` read off a cache the learner builds), the config's count per token."""
    return Exercise(title=title, teaches=teaches, computed_by=tuple(ENGINE + path for path in (
        "kv_cache.kv_cache_bytes", "kv_quant.int8_kv_cache_bytes", "kv_cache.StaticKVCache",
        "kv_cache.StaticKVCache.nbytes", "kv_quant.Int8KVCache", "kv_quant.Int8KVCache.nbytes",
        "config.ModelConfig.kv_values_per_token")),
        receives=(ENGINE + "config.ModelConfig",), allowed=(ENGINE + "config.ModelConfig.head_dim",))


CACHE_SIZE = _cache_bytes_exercise(SIZE, "the bytes a KV cache needs, layers x 2 x kv-heads x head_dim x length x batch")


@grades_quietly
@graded(CACHE_SIZE)
def check_cache_size(fn) -> None:
    """Check fn(config, length, batch, bytes_per_value) -> bytes against kv_cache_bytes.
    Introduced in notebook 01 (KV cache). The configurations (grouped-query, full multi-head, 7B, wide
    heads) give each slip of `SIZE_MISTAKES` its own answers, to name the slip. Graded by reach (`CACHE_SIZE`).
    """
    _grade_formula(
        SIZE, fn, SIZE_CASES, lambda c, n, b, by: kv_cache_bytes(c, n, b, BYTES_TO_DTYPE[by]), SIZE_MISTAKES,
        asked=lambda config: f"a number of bytes for {config.name}",
        bad_answer=(lambda got: not isinstance(got, (int, float)) or got <= 0,
                    "return a positive number of bytes (an int)."),
        fallback="layers x 2 (keys and values) x kv-heads x head-dim x length x batch x bytes per value.",
        describe=lambda case, want: (f"{want:,} bytes for {case[0].name} (length {case[1]}, batch {case[2]}, "
                                     f"{case[3]} bytes per value)"))


FIT = "KV cache: tokens that fit"
# Budgets: an exact fit (the answer is the case's length) and one with half a token to spare (still the length).
FIT_CASES = [(c, _formula(c, n, b, by) + extra * _formula(c, 1, b, by) // 2, b, by)
             for (c, n, b, by) in SIZE_CASES for extra in (0, 1)]
FIT_MISTAKES = [(lambda c, m, b, by, wrong=wrong: m // wrong(c, 1, b, by), hint)
                for wrong, hint in SIZE_MISTAKES if "length" not in hint] + [
    (lambda c, m, b, by: -(-m // _formula(c, 1, b, by)), "round down: a token whose keys and values do not fit "
                                                         "whole does not fit (the cache must be at most the budget)."),
    (lambda c, m, b, by: m // _formula(c, 1, b, by) - 1, "an exact fit counts: the cache may take the whole budget."),
]
TOKENS_THAT_FIT = _cache_bytes_exercise(FIT, "the longest cache that fits a byte budget: the bytes of one token "
                                             "of the whole batch, and a division rounded down")


@grades_quietly
@graded(TOKENS_THAT_FIT)
def check_tokens_that_fit(fn) -> None:
    """Check fn(config, budget_bytes, batch, bytes_per_value) -> the longest length whose cache fits.
    Introduced in notebook 01 (KV cache), exercise 3: the cache-size formula turned around. Budgets that fit
    exactly and ones with half a token to spare tell rounding up and off-by-one apart; `check_cache_size`'s
    configurations tell each slip of the formula apart. Graded by reach (`TOKENS_THAT_FIT`).
    """
    _grade_formula(
        FIT, fn, FIT_CASES, lambda c, m, b, by: m // _formula(c, 1, b, by), FIT_MISTAKES,
        asked=lambda config: f"a number of tokens for {config.name}",
        bad_answer=(lambda got: not isinstance(got, (int, float)) or isinstance(got, bool) or got < 0,
                    "return a whole number of tokens (an int, at least 0)."),
        fallback=("bytes per token of the batch = layers x 2 x kv-heads x head-dim x batch x bytes per value; "
                  "divide the budget by it, rounding down."),
        describe=lambda case, want: (f"{want:,} tokens for {case[0].name} ({case[1]:,} bytes, batch {case[2]}, "
                                     f"{case[3]} bytes per value)"))
