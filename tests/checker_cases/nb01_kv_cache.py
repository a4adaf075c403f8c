"""Checker cases of notebook 01 (KV cache): the reference and each typical mistake."""

import torch

import labsupport as ls
from labsupport.checks import kv_cache as kv_checks
from labsupport.checks.kv_cache import (check_cache_size, check_cache_update, check_cached_generation,
                                        check_tokens_that_fit)
from labsupport.engine.kv_cache import FixedShapeWriter, kv_cache_bytes
from labsupport.engine.kv_quant import Int8KVCache, int8_kv_cache_bytes
from labsupport.lab import long_context_bytes

from checker_cases.common import accepts, refuses


# --- notebook 01 (KV cache) ---------------------------------------------------------------

def reference_update(key_buffer, value_buffer, new_keys, new_values, length):
    end = length + new_keys.shape[2]
    key_buffer[:, :, length:end] = new_keys
    value_buffer[:, :, length:end] = new_values
    return key_buffer[:, :, :end], value_buffer[:, :, :end]


def not_in_place(key_buffer, value_buffer, new_keys, new_values, length):
    return (torch.cat([key_buffer[:, :, :length], new_keys], dim=2),
            torch.cat([value_buffer[:, :, :length], new_values], dim=2))


def wrong_position(key_buffer, value_buffer, new_keys, new_values, length):
    end = length + new_keys.shape[2]
    key_buffer[:, :, length + 1:end + 1] = new_keys
    value_buffer[:, :, length + 1:end + 1] = new_values
    return key_buffer[:, :, :end], value_buffer[:, :, :end]


def whole_buffer(key_buffer, value_buffer, new_keys, new_values, length):
    reference_update(key_buffer, value_buffer, new_keys, new_values, length)
    return key_buffer, value_buffer


def swapped(key_buffer, value_buffer, new_keys, new_values, length):
    keys, values = reference_update(key_buffer, value_buffer, new_keys, new_values, length)
    return values, keys


def only_new(key_buffer, value_buffer, new_keys, new_values, length):
    reference_update(key_buffer, value_buffer, new_keys, new_values, length)
    return new_keys, new_values


def only_first_new_token(key_buffer, value_buffer, new_keys, new_values, length):   # assumes T = 1
    key_buffer[:, :, length] = new_keys[:, :, 0]
    value_buffer[:, :, length] = new_values[:, :, 0]
    return key_buffer[:, :, :length + 1], value_buffer[:, :, :length + 1]


def ignores_length(key_buffer, value_buffer, new_keys, new_values, length):
    return reference_update(key_buffer, value_buffer, new_keys, new_values, 0)


def heads_as_sequence(key_buffer, value_buffer, new_keys, new_values, length):         # T from dimension 1
    end = length + new_keys.shape[1]
    key_buffer[:, :, length:end] = new_keys
    value_buffer[:, :, length:end] = new_values
    return key_buffer[:, :, :end], value_buffer[:, :, :end]


def through_the_engines_writer(key_buffer, value_buffer, new_keys, new_values, length):
    """The engine's fixed-shape writer over the learner's buffers: the right numbers, the package's write."""
    end = length + new_keys.shape[2]
    writer = FixedShapeWriter(key_buffer[None], value_buffer[None], torch.arange(1), torch.arange(length, end))
    keys, values = writer.update(0, new_keys, new_values)
    return keys[:, :, :end], values[:, :, :end]


def through_a_static_cache(key_buffer, value_buffer, new_keys, new_values, length):
    """A StaticKVCache whose one layer is the learner's buffers: its write does the work."""
    batch, heads, max_len, head_dim = key_buffer.shape
    config = ls.ModelConfig(family="llama", vocab_size=8, hidden_size=heads * head_dim, num_layers=1,
                            num_heads=heads, num_kv_heads=heads, intermediate_size=8, max_position=max_len)
    cache = ls.StaticKVCache(config, batch, max_len)
    cache.layer_keys, cache.layer_values = [key_buffer], [value_buffer]
    return cache.write(0, new_keys, new_values, length)


# --- the cached greedy loop (exercise 2) ----------------------------------------------------

def cached_loop(model, prompt_ids, new_tokens, max_len=None, dtype=None, first=-1, positions=None,
                feed_all=False, softmax=False, extra_pass=False, rows=1):
    """The reference loop, with switches that each introduce one typical mistake."""
    cache = ls.StaticKVCache(model.config, rows, max_len or len(prompt_ids) + new_tokens, device=model.device,
                             dtype=dtype or model.dtype)
    sequence = torch.tensor([prompt_ids], device=model.device)                  # (1, T)
    logits = model.logits(model(sequence, cache=cache), at=first)              # (1, vocab)
    new_ids, step_logits = [], []
    for step in range(new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)                        # (1, 1)
        new_ids.append(int(next_token))
        step_logits.append(logits.softmax(-1) if softmax else logits)
        sequence = torch.cat([sequence, next_token], dim=1)
        if step < new_tokens - 1 or extra_pass:
            fed = sequence if feed_all else next_token
            kwargs = {} if positions is None else {"positions": positions(cache, fed)}
            logits = model.logits(model(fed, cache=cache, **kwargs), at=-1)
    return new_ids, torch.cat(step_logits)


def without_cache(model, prompt_ids, new_tokens):
    sequence = torch.tensor([prompt_ids], device=model.device)
    new_ids, step_logits = [], []
    for _ in range(new_tokens):
        logits = model.logits(model(sequence), at=-1)
        next_token = logits.argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
        new_ids.append(int(next_token))
        step_logits.append(logits)
    return new_ids, torch.cat(step_logits)


def prompt_one_token_at_a_time(model, prompt_ids, new_tokens):
    cache = ls.StaticKVCache.for_model(model, 1, len(prompt_ids) + new_tokens)
    for token in prompt_ids:
        logits = model.logits(model(torch.tensor([[token]], device=model.device), cache=cache), at=-1)
    new_ids, step_logits = [], []
    for step in range(new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)
        new_ids.append(int(next_token))
        step_logits.append(logits)
        if step < new_tokens - 1:
            logits = model.logits(model(next_token, cache=cache), at=-1)
    return new_ids, torch.cat(step_logits)


# Ways of holding the package's cached loop, each refused (grading by reach: labsupport/checks/grading.py).

def generate_01(model, prompt_ids, new_tokens):
    result = ls.generate(model, prompt_ids, new_tokens, eos_token_ids=(), return_logits=True)
    return result.tokens[0].tolist(), torch.cat(result.logits)


def generate_by_default(model, prompt_ids, new_tokens, _generate=ls.generate):
    result = _generate(model, prompt_ids, new_tokens, eos_token_ids=(), return_logits=True)
    return result.tokens[0].tolist(), torch.cat(result.logits)


def _generate_in_a_closure():
    run = ls.generate

    def generate_with_cache(model, prompt_ids, new_tokens):
        result = run(model, prompt_ids, new_tokens, eos_token_ids=(), return_logits=True)
        return result.tokens[0].tolist(), torch.cat(result.logits)
    return generate_with_cache


def generate_through_a_helper(model, prompt_ids, new_tokens):
    return generate_01(model, prompt_ids, new_tokens)


def engine_steps(model, prompt_ids, new_tokens):
    """The loop around the engine's own prefill and decode steps: the steps are the exercise."""
    cache = ls.StaticKVCache.for_model(model, 1, len(prompt_ids) + new_tokens)
    logits = ls.prefill(model, torch.tensor([prompt_ids], device=model.device), cache)
    new_ids, step_logits = [], []
    for step in range(new_tokens):
        next_token = logits.argmax(dim=-1)
        new_ids.append(int(next_token))
        step_logits.append(logits)
        if step < new_tokens - 1:
            logits = ls.decode_step(model, cache, next_token)
    return new_ids, torch.cat(step_logits)


def size_formula(config, length, batch, bytes_per_value):
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * length * batch * bytes_per_value


BYTES = {4: torch.float32, 2: torch.float16, 1: torch.int8}


def tokens_that_fit(config, budget_bytes, batch, bytes_per_value):
    # the notebook's solution: one token of the whole batch, then a division rounded down
    per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim * batch * bytes_per_value
    return budget_bytes // per_token


def fit_by_default(config, budget_bytes, batch, bytes_per_value, _bytes=kv_cache_bytes):
    return budget_bytes // _bytes(config, 1, batch, BYTES[bytes_per_value])


def _fit_in_a_closure():
    bytes_of = ls.kv_cache_bytes
    return lambda c, m, b, by: m // bytes_of(c, 1, b, BYTES[by])


def fit_through_a_helper(config, budget_bytes, batch, bytes_per_value):
    return fit_by_default(config, budget_bytes, batch, bytes_per_value)


def fit_from_an_allocated_cache(config, budget_bytes, batch, bytes_per_value):
    return budget_bytes // ls.StaticKVCache(config, batch, 1, dtype=BYTES[bytes_per_value]).nbytes


def fit_from_an_int8_cache(config, budget_bytes, batch, bytes_per_value):
    per_token = Int8KVCache(config, batch, 1).nbytes * bytes_per_value // (config.head_dim + 2)
    return budget_bytes // per_token


OWN_CODE = "expected your own code, got a call of the package's"

NOTEBOOK_01 = [
    accepts(check_cache_update, "reference", reference_update),
    refuses(check_cache_update, "not-in-place", "in place", not_in_place),
    refuses(check_cache_update, "one-position-late", "position", wrong_position),
    refuses(check_cache_update, "the-whole-buffer", "shape", whole_buffer),
    refuses(check_cache_update, "values-first", "swapped", swapped),
    refuses(check_cache_update, "no-pair", "pair", lambda *args: None),
    refuses(check_cache_update, "only-the-new-keys-returned", "not only the new ones", only_new),
    refuses(check_cache_update, "assumes-one-new-token", "T > 1 new tokens", only_first_new_token),
    refuses(check_cache_update, "ignores-length", "first free position is `length`", ignores_length),
    refuses(check_cache_update, "sequence-from-the-heads-dimension", "dimension 2", heads_as_sequence),
    refuses(check_cache_update, "the-engines-fixed-shape-writer", "FixedShapeWriter", through_the_engines_writer),
    refuses(check_cache_update, "the-engines-static-cache", "StaticKVCache", through_a_static_cache),
    refuses(check_cache_update, "the-checkers-own-reference-cache", "checks.kv_cache._one_layer_cache",
            lambda kb, vb, k, v, n: kv_checks._one_layer_cache(*kb.shape).write(0, k, v, n)),
    accepts(check_cached_generation, "reference", cached_loop),
    refuses(check_cached_generation, "no-cache", "cache is not used", without_cache),
    refuses(check_cached_generation, "cache-too-short", "max_len = len\\(prompt_ids\\) \\+ new_tokens",
            lambda m, p, n: cached_loop(m, p, n, max_len=len(p) + 1)),
    refuses(check_cached_generation, "cache-in-float32-always", "dtype=model.dtype",
            lambda m, p, n: cached_loop(m, p, n, dtype=torch.float32)),
    refuses(check_cached_generation, "first-position-logits", "prompt's last position",
            lambda m, p, n: cached_loop(m, p, n, first=0)),
    refuses(check_cached_generation, "positions-restart-at-0", "positions continue from the cache",
            lambda m, p, n: cached_loop(m, p, n, positions=lambda cache, fed: torch.zeros_like(fed))),
    refuses(check_cached_generation, "whole-sequence-into-the-cache", "feed only the token just picked",
            lambda m, p, n: cached_loop(m, p, n, feed_all=True)),
    refuses(check_cached_generation, "probabilities", "not probabilities",
            lambda m, p, n: cached_loop(m, p, n, softmax=True)),
    refuses(check_cached_generation, "prompt-one-token-at-a-time", "prefill", prompt_one_token_at_a_time),
    refuses(check_cached_generation, "no-pair", "pair", lambda m, p, n: cached_loop(m, p, n)[0]),
    refuses(check_cached_generation, "the-packages-generate", "generation.generate", generate_01),
    refuses(check_cached_generation, "the-packages-generate-as-a-default-argument", "default argument",
            generate_by_default),
    refuses(check_cached_generation, "the-packages-generate-in-a-closure", "closure", _generate_in_a_closure()),
    refuses(check_cached_generation, "the-packages-generate-through-a-helper", "generate_through_a_helper",
            generate_through_a_helper),
    refuses(check_cached_generation, "the-engines-prefill-and-decode-steps", "generation.(prefill|decode_step)",
            engine_steps),
    refuses(check_cached_generation, "the-uncached-loop-of-the-package", "generation.generate_naive",
            lambda m, p, n: (ls.generate_naive(m, p, n, eos_token_ids=()).tokens[0].tolist(), None)),
    refuses(check_cached_generation, "the-checkers-own-test-model", "checks.kv_cache.tiny_test_model",
            lambda m, p, n: cached_loop(kv_checks.tiny_test_model("tiny-llama"), p, n)),
    refuses(check_cached_generation, "one-pass-after-the-last-token", "the last token needs no pass",
            lambda m, p, n: cached_loop(m, p, n, max_len=len(p) + n, extra_pass=True)),
    refuses(check_cached_generation, "a-cache-of-two-rows", "one row",
            lambda m, p, n: cached_loop(m, p, n, rows=2)),
    accepts(check_tokens_that_fit, "reference", tokens_that_fit),
    refuses(check_tokens_that_fit, "via-the-package", OWN_CODE, lambda c, m, b, by: m // ls.kv_cache_bytes(c, 1, b, BYTES[by])),
    refuses(check_tokens_that_fit, "the-package-as-a-default-argument", "default argument", fit_by_default),
    refuses(check_tokens_that_fit, "the-package-in-a-closure", "closure", _fit_in_a_closure()),
    refuses(check_tokens_that_fit, "the-package-through-a-helper", "fit_through_a_helper", fit_through_a_helper),
    refuses(check_tokens_that_fit, "an-allocated-cache", "StaticKVCache", fit_from_an_allocated_cache),
    refuses(check_tokens_that_fit, "an-int8-caches-bytes", "Int8KVCache", fit_from_an_int8_cache),
    refuses(check_tokens_that_fit, "the-int8-formula", "int8_kv_cache_bytes",
            lambda c, m, b, by: m // (int8_kv_cache_bytes(c, 1, b) * by // (c.head_dim + 2))),
    refuses(check_tokens_that_fit, "the-configs-values-per-token", "ModelConfig.kv_values_per_token",
            lambda c, m, b, by: m // (c.kv_values_per_token * b * by)),
    refuses(check_tokens_that_fit, "the-checkers-own-formula", "checks.kv_cache._formula",
            lambda c, m, b, by: m // kv_checks._formula(c, 1, b, by)),
    refuses(check_tokens_that_fit, "a-lab-modules-copy", "lab.long_context_bytes.cache_bytes_per_token",
            lambda c, m, b, by: m // (long_context_bytes.cache_bytes_per_token(c, {4: "fp32", 2: "fp16"}[by]) * b)),
    refuses(check_tokens_that_fit, "head-dim-from-hidden-size", "config.head_dim",
            lambda c, m, b, by: m // (c.num_layers * 2 * c.num_kv_heads * (c.hidden_size // c.num_heads) * b * by)),
    refuses(check_tokens_that_fit, "copies-the-size-formula", "tokens",
            lambda c, m, b, by: size_formula(c, m, b, by)),
    refuses(check_tokens_that_fit, "rounds-up", "round down", lambda c, m, b, by: -(-m // size_formula(c, 1, b, by))),
    refuses(check_tokens_that_fit, "rounds-to-nearest", "down",
            lambda c, m, b, by: round(m / size_formula(c, 1, b, by))),
    refuses(check_tokens_that_fit, "off-by-one", "exact fit", lambda c, m, b, by: m // size_formula(c, 1, b, by) - 1),
    refuses(check_tokens_that_fit, "one-sequence", "own cache", lambda c, m, b, by: m // size_formula(c, 1, 1, by)),
    refuses(check_tokens_that_fit, "query-heads", "num_kv_heads",
            lambda c, m, b, by: m // (c.num_layers * 2 * c.num_heads * c.head_dim * b * by)),
    refuses(check_tokens_that_fit, "keys-only", "multiply by 2", lambda c, m, b, by: m // (size_formula(c, 1, b, by) // 2)),
    refuses(check_tokens_that_fit, "a-float", "tokens", lambda c, m, b, by: m / size_formula(c, 1, b, by)),
    refuses(check_tokens_that_fit, "negative", "at least 0", lambda c, m, b, by: -1),
    accepts(check_cache_size, "reference", size_formula),
    refuses(check_cache_size, "keys-only", "multiply by 2", lambda c, n, b, by: size_formula(c, n, b, by) // 2),
    refuses(check_cache_size, "query-heads", "num_kv_heads",
            lambda c, n, b, by: size_formula(c, n, b, by) * c.num_heads // c.num_kv_heads),
    refuses(check_cache_size, "one-layer", "num_layers",
            lambda c, n, b, by: size_formula(c, n, b, by) // c.num_layers),
    refuses(check_cache_size, "values-not-bytes", "bytes_per_value", lambda c, n, b, by: size_formula(c, n, b, 1)),
    refuses(check_cache_size, "one-sequence", "multiply by batch", lambda c, n, b, by: size_formula(c, n, 1, by)),
    refuses(check_cache_size, "bits", "not bits", lambda c, n, b, by: 8 * size_formula(c, n, b, by)),
    refuses(check_cache_size, "negative", "positive", lambda c, n, b, by: -1),
    refuses(check_cache_size, "hidden-size-per-token", "not hidden_size",
            lambda c, n, b, by: c.num_layers * 2 * c.hidden_size * n * b * by),
    refuses(check_cache_size, "head-dim-from-hidden-size", "config.head_dim",
            lambda c, n, b, by: c.num_layers * 2 * c.num_kv_heads * (c.hidden_size // c.num_heads) * n * b * by),
    refuses(check_cache_size, "no-length", "multiply by the length", lambda c, n, b, by: size_formula(c, 1, b, by)),
    refuses(check_cache_size, "raises", "num_layers, num_kv_heads and head_dim",
            lambda c, n, b, by: c.num_key_value_heads),
]


# --- mutation testing (scripts/checker_mutants.py) --------------------------------------------------

EQUIVALENT_MUTANTS = {
    "kv_cached_loop": {
        "11:39:unary:drop-USub": "logits.argmax(dim=1) for dim=-1: the logits are always (1, vocab) (model.logits at "
                                 "one position), and dim 1 of a 2-D tensor is its last",
        "15:70:constant:1-1": "model.logits(..., at=0) for at=-1 on a decode pass: it feeds one token, so the hidden "
                              "states are (1, 1, hidden) and position 0 is the last",
    },
}
