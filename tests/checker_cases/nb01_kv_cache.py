"""Checker cases of notebook 01 (KV cache): the reference and each typical mistake."""

import torch

import labsupport as ls
from labsupport.checks.kv_cache import (check_cache_size, check_cache_update, check_cached_generation,
                                        check_tokens_that_fit)

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


# --- the cached greedy loop (exercise 2) ----------------------------------------------------

def cached_loop(model, prompt_ids, new_tokens, max_len=None, dtype=None, first=-1, positions=None,
                feed_all=False, softmax=False):
    """The reference loop, with switches that each introduce one typical mistake."""
    cache = ls.StaticKVCache(model.config, 1, max_len or len(prompt_ids) + new_tokens, device=model.device,
                             dtype=dtype or model.dtype)
    sequence = torch.tensor([prompt_ids], device=model.device)                  # (1, T)
    logits = model.logits(model(sequence, cache=cache), at=first)              # (1, vocab)
    new_ids, step_logits = [], []
    for step in range(new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)                        # (1, 1)
        new_ids.append(int(next_token))
        step_logits.append(logits.softmax(-1) if softmax else logits)
        sequence = torch.cat([sequence, next_token], dim=1)
        if step < new_tokens - 1:
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


def size_formula(config, length, batch, bytes_per_value):
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * length * batch * bytes_per_value


BYTES = {4: torch.float32, 2: torch.float16, 1: torch.int8}


def tokens_that_fit(config, budget_bytes, batch, bytes_per_value):
    # the notebook's solution: one token of the whole batch, then a division rounded down
    per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim * batch * bytes_per_value
    return budget_bytes // per_token


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
    accepts(check_tokens_that_fit, "reference", tokens_that_fit),
    accepts(check_tokens_that_fit, "via-the-package", lambda c, m, b, by: m // ls.kv_cache_bytes(c, 1, b, BYTES[by])),
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
