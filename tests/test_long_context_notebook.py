"""Notebook 08 (long context): its figures, its explorer and its benchmark section, on tiny
random models (fast; its checkers: tests/test_long_context_checkers.py)."""

import pytest
import torch

from labsupport.lab.long_context_bytes import kv_head_variants, predicted_step_seconds, step_bytes
from labsupport.errors import LabError
from labsupport.lab.long_context import decode_attention_share, time_kv_variants, window_perplexity
from labsupport.engine.config import PRESETS
from labsupport.plots.long_context import (crossover_figure, decode_share_figure, kv_variants_figure,
                                           prefill_attention_figure, step_split_figure, tiling_figure,
                                           time_per_token_curve_figure, window_figure)
from labsupport.lab.long_context_prefill import naive_attention_bytes, prefill_attention_sweep
from labsupport.lab.workloads import LONG_CONTEXT_PRESETS, long_context_workload

TOKENS = [(5 * i + 1) % 250 for i in range(40)]


# --- figures ---------------------------------------------------------------------------------

def test_prefill_figure_drops_the_naive_points_over_the_budget():
    tiny = PRESETS["tiny-llama"]
    budget = naive_attention_bytes(1, tiny.num_heads, 32, 4)
    fig = prefill_attention_figure(prefill_attention_sweep(tiny, [16, 32, 64], budget, repeats=1), budget)
    naive_memory, fused_memory = fig.data[0], fig.data[2]
    assert list(naive_memory.x) == [16, 32] and list(fused_memory.x) == [16, 32, 64]
    assert fig.layout.xaxis.type == "log"
    with pytest.raises(LabError):
        prefill_attention_figure([], budget)


def test_tiling_figure_skips_the_upper_triangle_and_numbers_one_rows_walk():
    fig = tiling_figure(blocks=4, row_block=2)
    z = [list(row) for row in fig.data[0].z]
    assert z[0] == [1, 0, 0, 0] and z[2] == [2, 2, 2, 0] and z[3] == [1, 1, 1, 1]
    assert [a.text for a in fig.layout.annotations][:3] == ["step 1", "step 2", "step 3"]
    with pytest.raises(LabError, match="row_block"):
        tiling_figure(blocks=4, row_block=4)


def test_decode_share_and_variant_and_window_figures(tiny_llama):
    rows = decode_attention_share(tiny_llama, [8, 16], batches=[1, 2], repeats=1)
    fig = decode_share_figure(rows)
    assert len(fig.data) == 4 and list(fig.data[0].x) == [8, 16]
    measured, computed = fig.data[0::2], fig.data[1::2]           # per batch: timed share, bytes share
    assert [list(t.y) for t in measured] == [[100 * r["attention_share"] for r in rows if r["batch"] == b]
                                             for b in (1, 2)]      # as timed (two timings: noise may pass 100)
    assert all(0 < y < 100 for trace in computed for y in trace.y)
    variants = time_kv_variants(kv_head_variants(tiny_llama.config), 16, repeats=1)
    assert list(kv_variants_figure(variants).data[0].x) == ["MHA (4 kv-heads)", "GQA (2 kv-heads)", "MQA (1 kv-heads)"]
    windows = window_figure(window_perplexity(tiny_llama, TOKENS, [4, None]))
    assert list(windows.data[1].x) == ["4", "full"]


def test_crossover_figure_marks_the_crossover_inside_the_range():
    curves = [{"model": "m", "weight_bytes": 1000.0, "cache_bytes_per_token": 1.0, "batches": [1, 4]}]
    fig = crossover_figure(curves, max_context=2000)
    markers = [t for t in fig.data if t.mode == "markers+text"]
    assert [list(t.x) for t in markers] == [[1000.0], [250.0]]
    assert len([t for t in crossover_figure(curves, max_context=100).data if t.mode == "markers+text"]) == 0


def test_step_split_and_curve_figures():
    split = step_bytes(PRESETS["smollm2-135m"], 5e8, 1024, 4)
    fig = step_split_figure(split, predicted_step_seconds(split, 1e10), "label", measured_s=0.01)
    assert fig.layout.barmode == "stack" and fig.data[-1].y[0] == pytest.approx(10.0)
    assert fig.data[0].y[0] == pytest.approx(5e8 / 4 / 2**20)
    curve = time_per_token_curve_figure([0, 100], [0.01, 0.02], measured=[(100, 0.03)], highlight=100)
    assert list(curve.data[0].y) == pytest.approx([10, 20]) and list(curve.data[1].y) == pytest.approx([30])


# --- presets ---------------------------------------------------------------------------------

def test_presets_fit_the_model_and_stop_the_naive_attention_on_a_cpu():
    cpu = long_context_workload("cpu")
    assert cpu is LONG_CONTEXT_PRESETS["cpu"]
    smollm = PRESETS["smollm2-135m"]
    over = [T for T in cpu.prefill_lengths if naive_attention_bytes(1, smollm.num_heads, T, 4) > cpu.naive_budget_bytes]
    assert over and 2048 not in over                                     # 2048 still runs: the bench's figure
    for preset in LONG_CONTEXT_PRESETS.values():
        assert max(preset.decode_contexts) < smollm.max_position and preset.long_context in preset.decode_contexts
        assert None in preset.windows


# --- explorer --------------------------------------------------------------------------------

@pytest.mark.parametrize("use_widget", [True, False])
def test_explorer_computes_everywhere_and_measures_its_own_shape_once(tiny_llama, use_widget, monkeypatch):
    from labsupport.explorers import long_context as module

    calls = []
    original = module.filled_cache
    monkeypatch.setattr(module, "filled_cache", lambda *a, **k: calls.append(a[1:]) or original(*a, **k))
    explorer = module.long_context_explorer(tiny_llama, bandwidth=1e9, measured={(128, 1, "float"): 0.002},
                                            max_context=192, use_widget=use_widget)
    assert calls == [] and explorer.status.value == ""                  # opened on a measured point
    split, curve = (live.figure for live in explorer.figures)
    assert split.data[-1].y[0] == pytest.approx(2.0)                     # 2 ms measured, batch 1
    explorer.controls["precision"].value = "int8"
    assert calls == [(1, 128, "int8")]
    explorer.controls["kv_heads"].value = 1                               # not the model's shape: computed only
    split = explorer.figures[0].figure
    assert calls == [(1, 128, "int8")] and "computed only" in split.layout.title.text
    explorer.controls["kv_heads"].value = 2
    explorer.controls["precision"].value = "fp32"
    assert len(calls) == 1                                               # revisiting measures nothing new


# --- the benchmark section -------------------------------------------------------------------

def test_bench_section_reports_bytes_speed_memory_and_crossovers(tiny_llama):
    from labsupport.bench.core import BenchContext
    from labsupport.bench.long_context import section_long_context
    from labsupport.bench.long_context import LongContextOptions
    from labsupport.bench.suite import SECTIONS
    from labsupport.weights.fixtures import ByteTokenizer

    assert SECTIONS["long_context"].notebook.startswith("08")
    ctx = BenchContext(device=torch.device("cpu"))
    ctx._cache[("ours", torch.float32)] = (tiny_llama, ByteTokenizer())
    options = LongContextOptions(context=64, batch=2, prefill_lengths=(16, 32), naive_budget_mib=1, repeats=1)
    section = section_long_context(ctx, options)
    figures = {f["name"]: f for f in section["figures"]}
    sixteen = next(f for name, f in figures.items() if "16-bit" in name)
    assert sixteen["value"] == pytest.approx(2 * 16 / 18) and sixteen["met"] is (2 * 16 / 18 >= 1.9)
    speed = next(f for name, f in figures.items() if "speedup at context 64" in name)
    assert speed["target"] == 1.0 and "dequantizes" in speed["note"] and "busy" in speed
    memory = next(f for name, f in figures.items() if "memory at T=32" in name)
    assert memory["value"] == pytest.approx(section["prefill"][-1]["naive_bytes"] / section["prefill"][-1]["fused_bytes"])
    assert len([name for name in figures if "crossover" in name]) == 4
    from labsupport.plots.long_context import bench_section_figures
    assert len(bench_section_figures(section)) == 2
    with pytest.raises(LabError):
        LongContextOptions(context=0)
