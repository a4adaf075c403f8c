"""Notebook 08 (long context): the sliding window, the decode-bytes arithmetic, naive vs fused
attention, and the measurements' shapes (tiny random models only: fast; no speed asserted)."""

import pytest
import torch

from labsupport.lab.long_context_bytes import (cache_bytes_per_token, crossover_context, decode_weight_bytes,
                                         kv_head_variants, mla_bytes_per_token, predicted_step_seconds,
                                         step_bytes)
from labsupport.errors import LabError
from labsupport.engine.kv_cache import StaticKVCache, kv_cache_bytes
from labsupport.lab.long_context import (decode_attention_share, filled_cache, generation_agreement,
                                         kv_precision_quality, random_weights_model, time_cache_kinds,
                                         time_kv_variants, window_perplexity)
from labsupport.engine.config import PRESETS
from labsupport.engine.models.masks import causal_mask, fixed_decode_mask
from labsupport.lab.long_context_prefill import (fused_attention, naive_attention, naive_attention_bytes,
                                              prefill_attention_sweep)

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

SMOLLM = PRESETS["smollm2-135m"]
TOKENS = [(7 * i + 3) % 250 for i in range(60)]


# --- the sliding window (every path that attends: tests/test_window.py) -----------------------

def test_window_mask_sees_the_last_w_keys_only():
    mask = causal_mask(5, 0, None, "cpu", window=2)[0, 0]                              # (T, S)
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    assert torch.equal(mask, expected.bool())
    padded = causal_mask(2, 3, torch.tensor([[False, True, True, True, True]]), "cpu", window=3)   # (1, 1, 2, 5)
    assert padded[0, 0].tolist() == [[False, True, True, True, False], [False, False, True, True, True]]
    assert causal_mask(5, 0, None, "cpu", window=5) == "causal"                    # a window hiding nothing


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_a_window_at_least_the_context_is_the_plain_path(name):
    from labsupport.weights.fixtures import random_model
    model = random_model(name)
    tokens = torch.tensor([TOKENS])
    plain = model.logits(model(tokens))
    windowed = model.with_attention_window(len(TOKENS))
    torch.testing.assert_close(windowed.logits(windowed(tokens)), plain, atol=1e-6, rtol=1e-5)
    assert model.config.attention_window is None                                   # the model itself unchanged


def test_a_window_changes_the_logits_after_w_positions_only(tiny_llama):
    tokens = torch.tensor([TOKENS])
    plain = tiny_llama.logits(tiny_llama(tokens))
    windowed_model = tiny_llama.with_attention_window(8)
    windowed = windowed_model.logits(windowed_model(tokens))
    torch.testing.assert_close(windowed[:, :8], plain[:, :8], atol=1e-6, rtol=1e-5)
    assert (windowed[:, 8:] - plain[:, 8:]).abs().max() > 1e-4


def test_cached_decode_with_a_window_equals_the_windowed_full_pass(tiny_llama):
    tokens = torch.tensor([TOKENS[:20]])
    model = tiny_llama.with_attention_window(6)
    with torch.inference_mode():
        full = model.logits(model(tokens), at=-1)
        cache = StaticKVCache.for_model(model, 1, 20)
        model(tokens[:, :19], cache=cache)
        step = model.logits(model(tokens[:, 19:], cache=cache), at=-1)
        cache.truncate(19)
        writer = cache.reserve(1, fixed_shape=True)                                 # the compiled step's writes
        mask = fixed_decode_mask(20, writer.positions, None, window=6)
        static = model.logits(model(tokens[:, 19:], torch.tensor([[19]]), writer, mask), at=-1)
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(static, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, -3, 2.5, "8", True])
def test_attention_window_refuses_nonsense(tiny_llama, window):
    with pytest.raises(LabError, match="attention_window") as error:
        tiny_llama.with_attention_window(window)
    assert "\n" not in str(error.value)


def test_attention_window_takes_numpy_and_torch_integers(tiny_llama):
    import numpy as np
    for window in (np.int64(8), np.int32(8), torch.tensor(8)):
        windowed = tiny_llama.with_attention_window(window)
        assert windowed.config.attention_window == 8 and type(windowed.config.attention_window) is int
    assert tiny_llama.with_attention_window(None).config.attention_window is None


# --- decode bytes ------------------------------------------------------------------------------

def test_cache_bytes_per_token_and_the_crossover():
    assert cache_bytes_per_token(SMOLLM, "fp32") == kv_cache_bytes(SMOLLM, 1) == 30 * 2 * 3 * 64 * 4
    assert cache_bytes_per_token(SMOLLM, "fp16/bf16") * 2 == cache_bytes_per_token(SMOLLM, "fp32")
    assert cache_bytes_per_token(SMOLLM, "int8") == 30 * 2 * 3 * (64 + 2)
    weights = 1e9
    n = crossover_context(SMOLLM, weights, batch=1)
    bytes_there = step_bytes(SMOLLM, weights, round(n), 1)
    assert bytes_there["cache"] == pytest.approx(weights, rel=1e-4)
    assert crossover_context(SMOLLM, weights, batch=16) == pytest.approx(n / 16)
    seven_b = PRESETS["llama-7b-shape"]
    assert crossover_context(seven_b, decode_weight_bytes(seven_b, 2), 1, "fp16/bf16") == pytest.approx(
        (seven_b.num_parameters - 32000 * 4096) * 2 / (32 * 2 * 32 * 128 * 2))
    with pytest.raises(LabError, match="precision"):
        cache_bytes_per_token(SMOLLM, "int4")


def test_step_bytes_split_and_prediction():
    split = step_bytes(SMOLLM, 1000.0, context=10, batch=4)
    assert split["cache"] == 4 * 10 * 46080 and split["weights_per_token"] == 250.0
    assert split["cache_share"] == pytest.approx(split["cache"] / (split["cache"] + 1000.0))
    seconds = predicted_step_seconds(split, bandwidth=1e9)
    assert seconds["total_s"] == pytest.approx((split["cache"] + 1000) / 1e9)
    assert seconds["cache_per_token_s"] == pytest.approx(seconds["cache_s"] / 4)


def test_kv_head_variants_and_mla():
    variants = kv_head_variants(SMOLLM)
    assert {name: c.num_kv_heads for name, c in variants.items()} == {"MHA": 9, "GQA": 3, "MQA": 1}
    assert set(kv_head_variants(PRESETS["llama-7b-shape"])) == {"MHA", "MQA"}
    assert mla_bytes_per_token(SMOLLM) == 30 * (512 + 64) * 2


def test_decode_weight_bytes_matches_the_model(tiny_llama, tiny_gpt2):
    for model in (tiny_llama, tiny_gpt2):
        assert decode_weight_bytes(model.config, 4) == model.weight_bytes()


# --- naive vs fused attention ------------------------------------------------------------------

def test_naive_and_fused_attention_agree():
    q, k, v = (torch.randn(1, 3, 17, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.testing.assert_close(naive_attention(q, k, v), fused_attention(q, k, v), atol=1e-5, rtol=1e-5)
    assert naive_attention_bytes(1, 9, 2048, 4) == 2 * 9 * 2048 ** 2 * 4


def test_prefill_sweep_stops_the_naive_one_at_the_budget():
    tiny = PRESETS["tiny-llama"]
    budget = naive_attention_bytes(1, tiny.num_heads, 32, 4)
    rows = prefill_attention_sweep(tiny, [64, 16, 32], budget, repeats=1)
    assert [r["T"] for r in rows] == [16, 32, 64]
    assert [r["naive_over_budget"] for r in rows] == [False, False, True]
    assert rows[2]["naive_s"] is None and rows[2]["fused_s"] > 0 and rows[0]["max_difference"] < 1e-4
    assert rows[0]["memory"] == "computed" and rows[1]["naive_bytes"] == budget
    with pytest.raises(LabError):
        prefill_attention_sweep(tiny, [], budget)


# --- the measurements' shapes ------------------------------------------------------------------

def test_filled_cache_and_decode_share(tiny_llama):
    cache = filled_cache(tiny_llama, 2, 12, "int8")
    assert cache.length == 12 and cache.max_len == 13 and cache.keys.abs().max() > 0
    rows = decode_attention_share(tiny_llama, [8, 16], batches=[1, 2], repeats=1)
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 8), (1, 16), (2, 8), (2, 16)]
    assert all(0 < r["attention_share"] and r["cache_bytes"] == kv_cache_bytes(tiny_llama.config, r["context"],
                                                                             r["batch"]) for r in rows)
    with pytest.raises(LabError, match="context"):
        filled_cache(tiny_llama, 1, 1000)


def test_kv_variants_and_cache_kinds(tiny_llama):
    rows = time_kv_variants(kv_head_variants(tiny_llama.config), context=16, batch=1, repeats=1)
    assert [(r["variant"], r["kv_heads"]) for r in rows] == [("MHA", 4), ("GQA", 2), ("MQA", 1)]
    assert rows[0]["cache_bytes"] == 2 * rows[1]["cache_bytes"] == 4 * rows[2]["cache_bytes"]
    kinds = time_cache_kinds(tiny_llama, 16, repeats=1)
    assert kinds["float_bytes"] > 3 * kinds["int8_bytes"] and kinds["int8_s"] > 0
    model = random_weights_model(PRESETS["tiny-llama"].with_(num_kv_heads=1))
    assert model.config.num_kv_heads == 1


def test_quality_measurements(tiny_llama):
    quality = kv_precision_quality(tiny_llama, TOKENS)
    assert quality["top1_agreement"] > 0.9 and 0 < quality["relative_logit_difference"] < 0.05
    assert 0 < quality["kl_divergence"] < 0.01
    agreement = generation_agreement(tiny_llama, TOKENS[:5], 8)
    assert 0 <= agreement["same_tokens"] <= 1 and agreement["new_tokens"] == 8
    rows = window_perplexity(tiny_llama, TOKENS, [4, None])
    assert rows[0]["cache_bytes"] * 15 == rows[1]["cache_bytes"] == rows[1]["full_cache_bytes"]
    assert rows[0]["perplexity"] != rows[1]["perplexity"]
