"""Notebook 08 (long context): the int8 KV cache against the float cache, and its bytes."""

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.kv_cache import KVCache, kv_cache_bytes
from labsupport.engine.kv_quant import (Int8KVCache, dequantize_per_token, int8_kv_cache_bytes,
                                        quantize_per_token)
from labsupport.engine.config import PRESETS

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def test_quantize_per_token_round_trip_within_half_a_scale():
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0)) * 4   # (B, H, T, D)
    x[0, 1, 2] = 0.0                                                              # an all-zero token
    x[1, 0, 3, 5] = 300.0                                                         # an outlier in one token only
    q, scales = quantize_per_token(x)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert scales.dtype == torch.bfloat16 and scales.shape == (2, 3, 5, 1)
    assert int(q.abs().max()) == 127
    back = dequantize_per_token(q, scales, torch.float32)
    assert torch.all((back - x).abs() <= scales.float() / 2 + 1e-6)
    assert torch.equal(back[0, 1, 2], torch.zeros(8))                            # no NaN from 0 / 0
    # the outlier only coarsens its own token: the others keep their own, finer scales
    assert scales[1, 0, 3].item() > 2.0 and scales[1, 0, 2].item() < 0.2


def test_quantize_refuses_a_wrong_shape():
    with pytest.raises(LabError, match="head_dim"):
        quantize_per_token(torch.randn(3, 8))


def test_int8_cache_bytes_are_computed_exactly_and_halve_a_16_bit_cache():
    config = PRESETS["smollm2-135m"]
    cache = Int8KVCache(config, batch_size=2, max_len=64)
    assert cache.nbytes == int8_kv_cache_bytes(config, 64, 2) == 30 * 2 * 3 * 64 * 2 * (64 + 2)
    sixteen_bit = kv_cache_bytes(config, 64, 2, torch.float16)
    assert sixteen_bit / cache.nbytes == pytest.approx(2 * 64 / (64 + 2))
    assert kv_cache_bytes(config, 64, 2, torch.float32) / cache.nbytes == pytest.approx(4 * 64 / (64 + 2))


def test_int8_cache_is_a_kv_cache_and_keeps_the_protocol(tiny_llama):
    cache = Int8KVCache.for_model(tiny_llama, 1, 10)
    assert isinstance(cache, KVCache) and cache.dtype == tiny_llama.dtype
    assert not cache.fixed_shape_writes
    k = torch.randn(1, 2, 4, 16)
    keys, values = cache.reserve(4).update(0, k, k)
    assert keys.shape == (1, 2, 4, 16) and keys.dtype == torch.float32 and cache.length == 4
    keys, _ = cache.reserve(1).update(0, k[:, :, :1], k[:, :, :1])
    assert keys.shape == (1, 2, 5, 16)
    with pytest.raises(LabError, match="max_len"):
        cache.reserve(8)
    assert cache.length == 5                                     # a refused reservation moves nothing
    with pytest.raises(LabError, match="fixed-shape"):
        cache.reserve(1, fixed_shape=True)
    cache.truncate(0)
    assert cache.length == 0


def test_at_short_context_int8_logits_stay_close_to_the_float_cache():
    # the invariant: logits within 2% of the largest logit, and (nearly) the same greedy tokens;
    # larger random weights (x5) so that the tokens depend on the context
    from labsupport.checks.kv_cache import tiny_test_model
    from labsupport.lab.long_context import generation_agreement, kv_precision_quality
    model = tiny_test_model("tiny-llama", dtype=torch.float32, scale=5.0)
    run = generation_agreement(model, [5, 17, 99, 3, 42, 8], 24)
    assert 0 < run["relative_logit_difference"] <= 0.02         # > 0: it does quantize
    assert run["same_tokens"] >= 0.9
    forced = kv_precision_quality(model, [(7 * i + 3) % 250 for i in range(60)])
    assert forced["relative_logit_difference"] <= 0.02 and forced["top1_agreement"] >= 0.9
    assert forced["int8_ppl"] == pytest.approx(forced["float_ppl"], rel=0.01)
