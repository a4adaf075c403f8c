"""Notebook 01 (KV cache): per-step timing and its integration, GQA arithmetic, the
figures and the explorer (its checkers: tests/test_checkers.py). Tiny random models only: fast."""

import pytest

from labsupport.errors import LabError
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.lab.kv_cache_timing import (estimated_step_seconds, estimated_total_seconds, gqa_savings,
                                      time_per_token_by_position)
from labsupport.engine.config import PRESETS
from labsupport.plots.kv_cache import (cache_memory_figure, cumulative_time_figure, kv_layout_figure,
                                       per_token_time_figure)


# --- estimated_total_seconds: the integration math ---------------------------------------

def linear_rows(positions, a, b, name="naive_s"):
    return [{"position": p, "sequence_length": 10 + p, name: a + b * p} for p in positions]


def test_integration_is_exact_for_linear_step_times():
    a, b, n = 0.05, 0.002, 100
    rows = linear_rows([0, 30, 99], a, b)
    exact = n * a + b * n * (n - 1) / 2          # sum over positions 0..n-1
    assert estimated_total_seconds(rows, n)["naive_s"] == pytest.approx(exact)


def test_integration_extends_the_last_segment_beyond_the_measured_positions():
    a, b, n = 0.01, 0.001, 1000
    rows = linear_rows([0, 100, 200], a, b)      # measured up to 200 only
    assert estimated_total_seconds(rows, n)["naive_s"] == pytest.approx(n * a + b * n * (n - 1) / 2)


def test_integration_of_a_constant_and_of_both_modes():
    rows = [{"position": p, "naive_s": 1.0 + p, "cached_s": 0.5} for p in (0, 10)]
    totals = estimated_total_seconds(rows, 4)
    assert totals["cached_s"] == pytest.approx(2.0)
    assert totals["naive_s"] == pytest.approx(1 + 2 + 3 + 4)
    assert list(estimated_step_seconds(rows, "naive_s", 3)) == pytest.approx([1, 2, 3])
    with pytest.raises(LabError):
        estimated_total_seconds(rows, 0)


def test_time_per_token_by_position_returns_both_modes(tiny_llama):
    rows = time_per_token_by_position(tiny_llama, [40, 0, 20], prompt_len=8, repeats=1)
    assert [r["position"] for r in rows] == [0, 20, 40]
    assert [r["sequence_length"] for r in rows] == [8, 28, 48]
    assert all(r["naive_s"] > 0 and r["cached_s"] > 0 for r in rows)
    assert all(r["timings"][name]["median"] == r[name] for r in rows for name in ("naive_s", "cached_s"))
    only_cached = time_per_token_by_position(tiny_llama, [5], prompt_len=1, use_cache=True, repeats=1)
    assert set(only_cached[0]) == {"position", "sequence_length", "cached_s", "timings"}
    assert set(only_cached[0]["timings"]) == {"cached_s"} and only_cached[0]["timings"]["cached_s"]["spread"] == 0
    with pytest.raises(LabError, match="context"):
        time_per_token_by_position(tiny_llama, [1000], prompt_len=8)


# --- GQA -------------------------------------------------------------------------------

def test_gqa_savings_of_the_embedded_config():
    s = gqa_savings(PRESETS["smollm2-135m"], length=1024)
    assert (s["kv_heads"], s["num_heads"], s["ratio"]) == (3, 9, 3.0)
    assert s["gqa_bytes"] == 30 * 2 * 3 * 64 * 1024 * 4
    assert s["mha_bytes"] == 3 * s["gqa_bytes"]
    assert gqa_savings(PRESETS["gpt2"])["ratio"] == 1.0


# --- figures ---------------------------------------------------------------------------

def test_per_token_and_cumulative_figures():
    rows = [{"position": p, "sequence_length": 16 + p, "naive_s": 0.01 + 1e-4 * p, "cached_s": 0.005}
            for p in (0, 100, 200)]
    fig = per_token_time_figure(rows)
    assert len(fig.data) == 2
    assert list(fig.data[0].y) == pytest.approx([10, 20, 30])           # milliseconds
    assert "ms" in fig.layout.yaxis.title.text and fig.layout.xaxis.title.text
    fig = per_token_time_figure(rows, highlight={"sequence_length": 50, "seconds": 0.02})
    assert len(fig.data) == 3
    fig = cumulative_time_figure(rows, 300, measured_totals={64: {"naive_s": 1.0, "cached_s": 0.3}})
    assert len(fig.data) == 4                                            # two curves, two markers
    assert len(fig.data[0].x) == 300
    assert fig.data[0].y[-1] == pytest.approx(estimated_total_seconds(rows, 300)["naive_s"])
    assert "(s)" in fig.layout.yaxis.title.text


def test_cache_memory_figure_puts_measured_points_on_the_formula():
    config = PRESETS["smollm2-135m"]
    lengths = [128, 256, 512]
    measured = [(n, kv_cache_bytes(config, n)) for n in lengths]
    fig = cache_memory_figure(config, lengths, measured)
    names = [t.name for t in fig.data]
    assert len(fig.data) == 3 and "multi-head" in names[0] and "measured" in names[2]
    assert list(fig.data[1].y) == pytest.approx(list(fig.data[2].y))     # GQA formula = measured
    assert list(fig.data[0].y) == pytest.approx([3 * y for y in fig.data[1].y])
    assert "MiB" in fig.layout.yaxis.title.text
    assert len(cache_memory_figure(PRESETS["gpt2"], lengths).data) == 1  # no GQA line for full MHA


def test_kv_layout_figure_marks_what_one_decode_step_writes():
    config = PRESETS["smollm2-135m"]
    fig = kv_layout_figure(config, filled=6, max_len=10)
    keys, values = fig.data[:2]
    assert keys.y[0] == "layer 0 · kv head 0" and "⋮ layers 2-28" in keys.y and keys.y[-1] == "layer 29 · kv head 2"
    assert len(keys.y) == 3 * 3 + 1                                    # layers 0, 1, 29 x 3 kv heads, one gap row
    assert list(keys.z[0]) == [1] * 6 + [2] + [0] * 3                  # cached, written now, still empty
    assert all(v is None for v in keys.z[6]) and list(values.z) == list(keys.z)
    assert "head_dim=64" in fig.layout.title.text and "kv_heads=3" in fig.layout.title.text
    assert "11,520 numbers per token" in fig.layout.annotations[0].text          # 2 x 30 x 3 x 64
    batched = kv_layout_figure(PRESETS["tiny-llama"], filled=0, max_len=3, batch=2)
    assert len(batched.data[0].y) == 2 * 2 * 2 and "row 1" in batched.data[0].y[2]
    assert list(batched.data[0].z[0]) == [2, 0, 0]
    with pytest.raises(LabError, match="free slot"):
        kv_layout_figure(config, filled=10, max_len=10)


# --- explorer --------------------------------------------------------------------------

@pytest.mark.parametrize("use_widget", [True, False])
def test_explorer_redraws_when_a_control_changes(tiny_llama, use_widget, monkeypatch):
    from labsupport.explorers import kv_cache as module

    calls = []
    original = module.time_per_token_by_position
    monkeypatch.setattr(module, "time_per_token_by_position",
                        lambda *args, **kwargs: calls.append(args) or original(*args, **kwargs))
    kv_cache_explorer = module.kv_cache_explorer

    explorer = kv_cache_explorer(tiny_llama, max_length=128, initial_length=64, repeats=1, use_widget=use_widget)
    timing, memory = (live.figure for live in explorer.figures)
    before = [list(t.x) for t in timing.data]
    explorer.controls["length"].value = 112
    timing, memory = (live.figure for live in explorer.figures)
    after = [list(t.x) for t in timing.data]
    assert after != before and 112 in after[-1]
    assert len(memory.data[-1].x) == 2                                   # two measured allocations
    explorer.controls["use_cache"].value = False
    timing = explorer.figures[0].figure
    assert any("without cache" in (t.name or "") for t in timing.data)
    assert "nothing is kept" in explorer.figures[1].figure.layout.title.text
    # revisiting a setting measures nothing new
    assert len(calls) == 3
    explorer.controls["use_cache"].value = True
    explorer.controls["length"].value = 64
    assert len(calls) == 3 and explorer.status.value == ""


def test_explorer_opens_with_the_notebooks_measurements(tiny_llama, monkeypatch):
    from labsupport.explorers import kv_cache as module

    rows = time_per_token_by_position(tiny_llama, [0, 32, 64], prompt_len=16, repeats=1)   # 16, 48, 80 tokens
    allocated = [(n, kv_cache_bytes(tiny_llama.config, n)) for n in (64, 128, 256)]
    monkeypatch.setattr(module, "time_per_token_by_position", lambda *a, **k: pytest.fail("measured at opening"))
    explorer = module.kv_cache_explorer(tiny_llama, max_length=128, repeats=1, measured=rows,
                                        allocated=allocated, use_widget=False)
    assert explorer.controls["length"].value == 80                       # the longest measured length on the slider
    timing, memory = (live.figure for live in explorer.figures)
    assert [list(t.x) for t in timing.data[:2]] == [[16, 48, 80]] * 2   # both modes, as measured
    assert "measured" in memory.data[-1].name and list(memory.data[-1].x) == [64, 80, 128, 256]  # + the slider's
    assert max(memory.data[0].x) == 256                                  # the curve reaches the allocations


# --- the benchmark section ---------------------------------------------------------------

def test_bench_section_labels_the_7b_figure_computed_and_reports_busy(tiny_llama):
    import torch

    from labsupport.bench.core import BenchContext
    from labsupport.bench.kv_cache import section_kv_cache
    from labsupport.bench.kv_cache import KVCacheOptions
    from labsupport.weights.fixtures import ByteTokenizer

    ctx = BenchContext(device=torch.device("cpu"))
    ctx._cache[("ours", torch.float32)] = (tiny_llama, ByteTokenizer())
    options = KVCacheOptions(lengths=(4, 40), repeats=1, step_repeats=1, naive_budget_s=0.0)
    section = section_kv_cache(ctx, options)
    names = {f["name"]: f for f in section["figures"]}
    seven_b = next(f for name, f in names.items() if "7B" in name)
    assert seven_b["name"].endswith("computed") and seven_b["note"].startswith("computed from the formula, not measured")
    assert seven_b["busy"] is None and seven_b["value"] == 256.0
    assert all("busy" in f for f in section["figures"])                  # the timed ones carry their busy reason
    assert any("(estimated)" in name for name in names) and section["rows"][0]["same_tokens"]
    assert "timings" in section["per_position_s"][0]
