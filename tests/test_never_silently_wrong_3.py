"""Issue 26, items 4-8: inputs and numbers that used to come back silently wrong (or as a
torch traceback) from the int8 KV cache, the sliding-window bytes, the prefix cache and
static batching under a token budget. Each test failed on the code before its fix."""

import random

import numpy as np
import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.kv_quant import Int8KVCache, dequantize_per_token, quantize_per_token
from labsupport.engine.config import PRESETS
from labsupport.engine.serving import Engine, Request, prefix_cache
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.lab.long_context import window_cache_bytes
from serving_reference import alone, counting_forward, step_tokens

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BF16_SMALLEST = 2.0 ** -133                      # the smallest positive bfloat16 (a subnormal)


# --- item 4: every finite key stays finite through the int8 cache, within the int8 bound -----

def extreme_rows(dtype) -> torch.Tensor:
    """Rows of 8 numbers at the edges of `dtype`: its largest and most negative numbers, its
    smallest normal and subnormal ones, zeros, and rows that mix them; (1, 1, rows, 8)."""
    info = torch.finfo(dtype)
    big, small, sub = info.max, info.tiny, info.tiny * info.eps          # sub: the smallest subnormal
    rows = [[big] * 8, [info.min] * 8, [big, info.min] * 4, [small] * 8, [-small] * 8, [sub] * 8,
            [sub * k for k in range(8)], [0.0] * 8, [-0.0] * 8,
            [big, small, sub, 0.0, -big / 2, 1e-3, -1.0, 3.0],              # mixed
            [big / 3, -big / 7, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [small * 127 * 1.4] * 8,                                         # a scale among bf16 subnormals
            [small * 1.5, -small * 0.5, sub * 3, 0.0, 0.0, 0.0, 0.0, 0.0]]
    g = torch.Generator().manual_seed(0)
    for exponent in (-30, -10, -3, 0, 3, 10, 30):                            # ordinary rows at many scales
        rows.append((torch.randn(8, generator=g, dtype=torch.float64) * 10.0 ** exponent).tolist())
    x = torch.tensor(rows, dtype=torch.float64)
    return x.clamp(info.min, big).to(dtype)[None, None]                     # (1, 1, rows, 8)


def assert_within_the_int8_bound(x, back, scales):
    """Finite, and each number within half a quantization step (its row's scale / 2) plus the
    rounding to x's dtype; the scale itself at most one bfloat16 step above max|x| / 127."""
    assert torch.isfinite(back).all(), f"non-finite values from finite input: {back[~torch.isfinite(back)]}"
    info = torch.finfo(x.dtype)
    exact, got, s = x.double(), back.double(), scales.double()
    bound = s / 2 + info.eps / 2 * got.abs() + info.tiny * info.eps / 2
    assert ((got - exact).abs() <= bound * (1 + 1e-12)).all(), (got - exact).abs() - bound
    absmax = exact.abs().amax(dim=-1, keepdim=True)
    assert (s <= absmax / 127 * (1 + 2 ** -7) + BF16_SMALLEST).all()         # not a coarser scale
    assert torch.equal(s > 0, absmax > 0)                                    # only an all-zero row gets 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_round_trip_keeps_extreme_numbers_finite_and_within_the_bound(dtype):
    x = extreme_rows(dtype)
    q, scales = quantize_per_token(x)
    back = dequantize_per_token(q, scales, dtype)
    assert back.dtype == dtype
    assert_within_the_int8_bound(x, back, scales)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_cache_returns_finite_keys_at_the_dtypes_largest_number(tiny_llama, dtype):
    config = tiny_llama.config
    cache = Int8KVCache(config, 1, 32, dtype=dtype)
    rows = extreme_rows(dtype)[0, 0]                                          # (rows, 8)
    k = rows.repeat(1, config.head_dim // 8)[None, None].expand(1, config.num_kv_heads, -1, -1).contiguous()
    keys, values = cache.write(0, k, -k, start=0)                             # (1, kv_heads, rows, head_dim)
    assert torch.isfinite(keys).all() and torch.isfinite(values).all()
    largest = torch.finfo(dtype).max
    assert keys[0, 0, 0, 0].item() >= 0.99 * largest and values[0, 0, 0, 0].item() <= -0.99 * largest
    assert_within_the_int8_bound(k, keys, cache.key_scales[0, :, :, : k.shape[2]])


# --- item 5: window_cache_bytes checks its inputs --------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"window": 0}, "window .* must be at least 1, got 0"),
    ({"window": -3}, "window .* must be at least 1, got -3"),
    ({"window": 2.5}, "window .* must be a whole number, got 2.5"),
    ({"window": "8"}, "window .* must be a whole number"),
    ({"context": 0}, "context .* must be at least 1, got 0"),
    ({"context": 10.0}, "context .* must be a whole number"),
    ({"batch": 0}, "batch .* must be at least 1"),
    ({"batch": True}, "batch .* must be a whole number"),
    ({"dtype": "fp17"}, "Unknown precision"),
    ({"config": "smollm2-135m"}, "config must be a ModelConfig"),
])
def test_window_cache_bytes_refuses_bad_input_in_one_sentence(kwargs, message):
    args = {"config": PRESETS["smollm2-135m"], "context": 100, "window": 8, **kwargs}
    with pytest.raises(LabError, match=message):
        window_cache_bytes(**args)


def test_window_cache_bytes_takes_numpy_and_torch_integers():
    config = PRESETS["smollm2-135m"]
    plain = window_cache_bytes(config, 100, 8, batch=2, dtype=torch.float16)
    for window in (np.int64(8), torch.tensor(8), np.int32(8)):
        got = window_cache_bytes(config, np.int64(100), window, batch=torch.tensor(2), dtype="fp16")
        assert got == plain and type(got) is int
    assert window_cache_bytes(config, 100, None) == window_cache_bytes(config, 100, 500)   # window past the context


# --- item 6: a block name that collides never hands out another prompt's keys --------------

def every_block_collides(parent, tokens):
    """A block hash under which every block at depth d has the name d + 1, whatever its tokens."""
    return 1 + (0 if parent is None else parent)


@pytest.mark.parametrize("token_budget", [None, 5])
def test_a_forced_hash_collision_gives_the_colliding_prompt_its_own_keys(tiny_model_f64, monkeypatch,
                                                                         token_budget):
    monkeypatch.setattr(prefix_cache, "block_hash", every_block_collides)
    first = list(range(10, 23))                                  # 13 tokens: 3 full blocks of 4
    other = list(range(40, 53))                                  # same length, every block differs
    diverging = first[:4] + list(range(90, 99))                  # block 0 shared, blocks 1-2 differ
    requests = [Request(first, max_new_tokens=6, request_id="first"),
                Request(other, max_new_tokens=6, request_id="other", arrival=20),
                Request(diverging, max_new_tokens=6, request_id="diverging", arrival=40),
                Request(first, max_new_tokens=6, request_id="again", arrival=60)]
    engine = Engine(tiny_model_f64, max_slots=2, block_size=4, prefix_caching=True, token_budget=token_budget)
    result = engine.run(requests, clock="steps")
    for request in requests:
        assert result.tokens()[request.request_id] == alone(tiny_model_f64, request), request.request_id
    admitted = {seq.id: next(s.cached_tokens for s in result.steps if s.start == seq.admitted_at)
                for seq in result.sequences}
    assert admitted == {"first": 0, "other": 0, "diverging": 4, "again": 12}   # true hits are still used
    engine.blocks.assert_no_leaks()


# --- item 7: under a token budget no step computes more tokens than the budget ---------------

def test_static_batching_under_a_budget_of_5_computes_at_most_5_tokens(tiny_llama, monkeypatch):
    computed = counting_forward(monkeypatch)
    requests = [Request(list(range(1, 1 + n)), max_new_tokens=3, request_id=i) for i, n in enumerate([2, 9, 4])]
    result = Engine(tiny_llama, max_slots=3, policy="static", block_size=4, token_budget=5).run(
        requests, clock="steps")
    assert computed == [step_tokens(s) for s in result.steps]              # the records say what ran
    assert max(computed) <= 5
    assert [s.output for s in result.sequences] == [alone(tiny_llama, r) for r in requests]
    # padding rows are members that finished and keep their slot, never members still prefilling
    for step in result.steps:
        assert step.padding_rows == 0 or step.decode_rows > 0


# --- item 8: Int8KVCache's sizes and device get one sentence -------------------------------

@pytest.mark.parametrize("args, kwargs, message", [
    ((2.5, 16), {}, "batch_size .* must be a whole number, got 2.5"),
    ((1, 16.0), {}, "max_len .* must be a whole number, got 16.0"),
    (("2", 16), {}, "batch_size .* must be a whole number, got '2'"),
    ((0, 16), {}, "batch_size .* must be at least 1, got 0"),
    ((1, -4), {}, "max_len .* must be at least 1, got -4"),
    ((1, 10 ** 6), {}, "longer than the model's context"),
    ((1, 16), {"device": "tpu"}, "Unknown device 'tpu'"),
    ((1, 16), {"device": 3.5}, "Unknown device"),
    ((1, 16), {"dtype": torch.int8}, "dtype is the float dtype update returns .* got torch.int8"),
    ((1, 16), {"dtype": "fp17"}, "Unknown precision"),
])
def test_int8_cache_refuses_bad_sizes_devices_and_dtypes_in_one_sentence(args, kwargs, message):
    with pytest.raises(LabError, match=message):
        Int8KVCache(PRESETS["smollm2-135m"], *args, **kwargs)


def test_int8_cache_takes_numpy_and_torch_sizes_and_device_names():
    config = PRESETS["smollm2-135m"]
    cache = Int8KVCache(config, np.int64(2), torch.tensor(16), device=torch.device("cpu"), dtype="bf16")
    assert cache.batch_size == 2 and type(cache.max_len) is int and cache.keys.shape[3] == 16
    assert cache.dtype == torch.bfloat16 and cache.device.type == "cpu"


def test_the_block_manager_compares_tokens_behind_a_colliding_name(monkeypatch):
    from labsupport.engine.serving import BlockManager
    monkeypatch.setattr(prefix_cache, "block_hash", every_block_collides)
    blocks = BlockManager(num_blocks=12, block_size=2, prefix_caching=True)
    a, b = [1, 2, 3, 4, 5], [1, 2, 7, 8, 5]                  # block 0 equal, block 1 differs (same name)
    blocks.admit(0, a, 6)
    blocks.cache_full_blocks(0, a, 5)
    assert blocks.cached_prefix(b) == blocks.table(0)[:1]
    assert blocks.admit(1, b, 6) == 2                         # only block 0's positions come from the cache
    blocks.cache_full_blocks(1, b, 5)
    assert blocks.table(1)[1] != blocks.table(0)[1] and blocks.table(1)[1] not in blocks.prefix_cache
    assert blocks.cached_prefix(a + [6]) == blocks.table(0)[:2]   # a's own blocks are still found
    blocks.release(0), blocks.release(1)
    blocks.assert_no_leaks()
