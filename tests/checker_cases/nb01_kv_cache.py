"""Checker cases of notebook 01 (KV cache): the reference and each typical mistake."""

import torch

from labsupport.checks.kv_cache import check_cache_size, check_cache_update

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


def size_formula(config, length, batch, bytes_per_value):
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * length * batch * bytes_per_value


NOTEBOOK_01 = [
    accepts(check_cache_update, "reference", reference_update),
    refuses(check_cache_update, "not-in-place", "in place", not_in_place),
    refuses(check_cache_update, "one-position-late", "position", wrong_position),
    refuses(check_cache_update, "the-whole-buffer", "shape", whole_buffer),
    refuses(check_cache_update, "values-first", "swapped", swapped),
    refuses(check_cache_update, "no-pair", "pair", lambda *args: None),
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
]
