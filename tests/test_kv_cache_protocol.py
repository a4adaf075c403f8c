"""The KV-cache protocol (engine/kv_cache.py) as every cache implements it: what it declares
(shape, dtype, device, fixed-shape writes), `reserve` as the one place a length moves, on the
eager and the compiled path alike, and one sentence for every bad length or unfitting cache
(issue 26, items 9 and 10)."""

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from labsupport.engine.compiled import CompiledDecoder
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import FilledLength, KVCache, KVWriter, StaticKVCache, require_fitting_cache
from labsupport.engine.kv_quant import Int8KVCache
from labsupport.engine.serving import PagedKVCache
from labsupport.errors import LabError
from paged_rows import PagedRows
from labsupport.weights.fixtures import random_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

PROMPT = [5, 17, 42, 99, 3]


def caches(model, batch=1, max_len=16):
    """One of each kind of KVCache for `model`."""
    pool = PagedKVCache(model.config, 2 * batch * 4, 4, dtype=model.dtype)
    tables = [[2 * row * 2 + i for i in range(max_len // 4)] for row in range(batch)]
    return {"static": StaticKVCache.for_model(model, batch, max_len),
            "int8": Int8KVCache.for_model(model, batch, max_len),
            "paged": PagedRows(pool, tables)}


def one_sentence(error) -> None:
    message = str(error.value)
    assert "\n" not in message and ". " not in message and message.endswith("."), message


def test_every_cache_declares_the_protocol(tiny_llama):
    config = tiny_llama.config
    for name, cache in caches(tiny_llama).items():
        assert isinstance(cache, KVCache), name
        assert (cache.num_layers, cache.num_kv_heads, cache.head_dim) == (
            config.num_layers, config.num_kv_heads, config.head_dim), name
        assert cache.dtype == tiny_llama.dtype and cache.device == tiny_llama.device, name
        assert cache.fixed_shape_writes == (name == "static"), name


def test_reserve_hands_out_a_writer_and_moves_the_length_once(tiny_llama):
    for name, cache in caches(tiny_llama).items():
        writer = cache.reserve(3)
        assert isinstance(writer, KVWriter) and not isinstance(writer, KVCache) and cache.length == 3, name
        k = torch.randn(1, tiny_llama.config.num_kv_heads, 3, tiny_llama.config.head_dim)
        keys, _ = writer.update(0, k, k)                  # writing does not move the length again
        assert keys.shape[2] == 3 and cache.length == 3, name
        with pytest.raises(LabError, match="holds 16 positions and this step needs 19") as error:
            cache.reserve(16)
        one_sentence(error)
        assert cache.length == 3, name                    # a refused reservation moves nothing
        cache.truncate(np.int64(1))
        assert cache.length == 1 and type(cache.length) is int, name


@pytest.mark.parametrize("length, words", [(2.5, "whole number"), ("3", "whole number"), (True, "whole number"),
                                           (None, "whole number"), (-1, "at least 0"), (5, "at most 3")])
def test_truncate_refuses_what_is_not_a_length_it_holds(tiny_llama, length, words):
    for cache in caches(tiny_llama).values():
        cache.reserve(3)
        with pytest.raises(LabError, match=words) as error:
            cache.truncate(length)
        one_sentence(error)
        assert cache.length == 3


@pytest.mark.parametrize("n", [0, 2.5, -1, "1"])
def test_reserve_refuses_what_is_not_a_number_of_positions(tiny_llama, n):
    cache = StaticKVCache.for_model(tiny_llama, 1, 8)
    with pytest.raises(LabError, match="positions one pass writes") as error:
        cache.reserve(n)
    one_sentence(error)
    assert cache.length == 0


def test_a_cache_made_for_another_model_is_refused_before_it_is_used(tiny_llama):
    """Issue 26, item 9: such a cache used to pass the check and fail deep inside attention."""
    config = tiny_llama.config
    others = {"layers": config.with_(num_layers=3), "kv-heads": config.with_(num_kv_heads=4),
              "head size": config.with_(explicit_head_dim=32)}
    for what, other in others.items():
        other_model = random_model(other)
        for name, cache in caches(other_model, max_len=len(PROMPT) + 8).items():
            with pytest.raises(LabError, match="make the cache for this model") as error:
                generate(tiny_llama, PROMPT, 8, cache=cache)
            one_sentence(error)
            assert cache.length == 0, (what, name)


def test_a_cache_without_the_declarations_is_refused_in_one_sentence(tiny_llama):
    class OldCache(FilledLength):                         # update/advance era: no shape, dtype, device
        batch_size, max_len = 1, 32

    with pytest.raises(LabError, match="cache must be a KV cache with batch_size") as error:
        require_fitting_cache(OldCache(), 1, 10, tiny_llama)
    one_sentence(error)


def test_one_party_moves_the_length_on_the_eager_and_the_compiled_path(tiny_llama, monkeypatch):
    """Every pass reserves its positions once: after a generation the cache holds the prompt and
    one position per decode step, eager or compiled (the compiled warm-up rolls back its own)."""
    reserved = []
    original = StaticKVCache.reserve
    monkeypatch.setattr(StaticKVCache, "reserve", lambda self, n, fixed_shape=False: (
        reserved.append((n, fixed_shape)) or original(self, n, fixed_shape)))
    for compile in (False, CompiledDecoder(backend=CompileCounter())):
        reserved.clear()
        cache = StaticKVCache.for_model(tiny_llama, 1, len(PROMPT) + 8)
        result = generate(tiny_llama, PROMPT, 8, eos_token_ids=(), compile=compile, cache=cache)
        assert cache.length == len(PROMPT) + 7                             # the prompt and 7 decode steps
        steps = [r for r in reserved if r[0] == 1]
        assert reserved[-8:] == [(len(PROMPT), False)] + [(1, bool(compile))] * 7
        assert len(steps) == 7 + (1 if compile else 0) and result.decode_path == ("compiled" if compile else "eager")
