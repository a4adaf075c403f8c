"""Notebook 08's additions: the reference tiled attention and the call recorder its checker uses,
tiled vs fused on one layer, decode attention's arithmetic intensity (MHA, GQA, MQA, MLA), how
keys and values quantize per token and per channel, the "where it loses here" ledger, and the
explorer's figures laid out with the legend below the plots."""

import pytest
import torch
import torch.nn.functional as F

from labsupport.engine.config import PRESETS
from labsupport.lab.long_context import decode_attention_intensity, kv_grouping_errors
from labsupport.lab.long_context_prefill import LargestTensor, tiled_attention, tiled_vs_fused


@pytest.mark.parametrize("heads, kv_heads, n, tile, causal", [(4, 2, 37, 8, True), (3, 1, 50, 16, False),
                                                               (2, 2, 7, 16, True)])
def test_tiled_attention_is_sdpa_and_holds_one_tile_of_scores(heads, kv_heads, n, tile, causal):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, n, 16, generator=generator)
    k, v = (torch.randn(2, kv_heads, n, 16, generator=generator) for _ in range(2))
    with LargestTensor() as record:
        out = tiled_attention(q, k, v, tile, causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert torch.allclose(out, expected, atol=1e-5)
    if n > tile:                                                           # one tile is all keys otherwise
        assert not any(len(shape) == 4 and shape[-1] == n for shape, _ in record.shapes)   # no (.., T, T)
    assert record.largest[2] <= 4 * 2 * heads * n * 16
    assert "scaled_dot_product_attention" not in record.calls


def test_tiled_vs_fused_reports_times_and_the_largest_tensors():
    config = PRESETS["smollm2-135m"]
    run = tiled_vs_fused(tiled_attention, config, 128, tile=32, repeats=1)
    assert run["max_difference"] < 1e-4 and run["tiled_s"] > 0 and run["naive_s"] > 0 and run["fused_s"] > 0
    assert run["naive_largest_bytes"] == config.num_heads * 128 * 128 * 4                # one (1, H, T, T) fp32
    assert run["tiled_largest_bytes"] < run["naive_largest_bytes"]
    assert run["input_bytes"] == config.num_heads * 128 * config.head_dim * 4


def test_decode_attention_intensity_on_a_hub_shaped_config():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from labsupport.weights.hf_config import config_from_hf
    hub = config_from_hf(LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                     num_attention_heads=32, num_key_value_heads=32, vocab_size=49152))
    rows = decode_attention_intensity(hub, bytes_per_value=2)
    assert rows["MHA (32 kv-heads)"] == pytest.approx(1.0)            # 4d FLOPs on 2d two-byte numbers
    assert rows["MQA (1 kv-head)"] == pytest.approx(32.0)
    mla = rows["MLA (latent 512 + rope 64)"]
    assert mla == pytest.approx(32 * (2 * 576 + 2 * 512) / (576 * 2))   # every head on the same latent
    gqa = decode_attention_intensity(PRESETS["smollm2-135m"], bytes_per_value=4)
    assert gqa["GQA (3 kv-heads)"] == pytest.approx(2 * 9 / 3 / 4)


def test_keys_with_an_outlier_channel_quantize_better_per_channel():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 64, 32, generator=generator)
    keys[..., 5] *= 20                                                     # one channel large in every token
    values = torch.randn(2, 3, 64, 32, generator=generator) * torch.rand(1, 1, 64, 1, generator=generator) * 4
    rows = {(r["tensor"], r["bits"]): r for r in kv_grouping_errors(keys, values, bits=(8, 4))}
    assert rows[("keys", 4)]["per_channel"] < rows[("keys", 4)]["per_token"]
    assert rows[("keys", 4)]["outlier_ratio"] > 5
    assert rows[("values", 4)]["per_token"] < rows[("values", 4)]["per_channel"]   # tokens differ in size
    assert rows[("keys", 8)]["per_token"] < rows[("keys", 4)]["per_token"]


def test_the_ledger_names_what_lost_and_says_when_nothing_did():
    from labsupport.claims.long_context import long_context_losses
    prefill = [{"T": 256, "naive_s": 0.001, "fused_s": 0.002}, {"T": 4096, "naive_s": None, "fused_s": 0.1}]
    variants = [{"variant": "MHA", "kv_heads": 9, "attention_s": 0.010}, {"variant": "MQA", "kv_heads": 1, "attention_s": 0.010}]
    windows = [{"window": 32, "perplexity": 14.0}, {"window": None, "perplexity": 10.0}]
    quality = {"tokens": 512, "float_ppl": 10.0, "int8_ppl": 10.02}
    lines = long_context_losses(prefill, {"T": 2048, "tiled_s": 0.3, "fused_s": 0.01}, variants,
                                {"float_s": 0.5, "int8_s": 0.6}, quality, windows, busy="the load was high")
    text = " ".join(lines)
    assert "T = 256" in text and "30.0x" in text and "MQA" in text and "0.83x" in text and "10.020" in text
    assert "14.00" in text and "the load was high" in text
    quiet = long_context_losses([{"T": 256, "naive_s": 0.002, "fused_s": 0.001}], None,
                                [{"variant": "MHA", "kv_heads": 9, "attention_s": 0.02},
                                 {"variant": "MQA", "kv_heads": 1, "attention_s": 0.01}],
                                {"float_s": 0.6, "int8_s": 0.5}, {"tokens": 5, "float_ppl": 10.0, "int8_ppl": 10.0},
                                [{"window": None, "perplexity": 10.0}])
    assert quiet == ["Every technique helped here: nothing measured lost."]


def test_explorer_figures_keep_the_legend_below_and_the_details_in_the_hover():
    from labsupport.plots.long_context_explorer import explorer_curve_figure, explorer_step_figure
    split = {"weights_per_token": 2**20, "cache_per_token": 2**21}
    seconds = {"weights_per_token_s": 1e-3, "cache_per_token_s": 2e-3}
    fig = explorer_step_figure(split, seconds, "SmolLM2, 3 kv-heads, fp32 cache, batch 1, context 2048", 0.004)
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"
    assert fig.layout.margin.b >= 60 and all(len(str(x)) <= 10 for trace in fig.data for x in trace.x)
    assert all("context 2048" in trace.hovertemplate for trace in fig.data)
    curve = explorer_curve_figure([0, 64], [1e-3, 2e-3], [(64, 2e-3)], highlight=64, detail="batch 1")
    assert curve.layout.legend.y < 0 and "batch 1" in curve.layout.title.text
