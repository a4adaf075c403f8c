"""The figures read cleanly at a laptop's width: drawn in headless Chromium at the width
JupyterLab gives them at 1366 px, nothing is cut off and nothing sits on anything else
(tests/figure_layout.py measures every title, annotation, axis title, tick label and legend).

Each case is a figure that was once unreadable at that width, drawn from inputs of the size
the notebooks give it; docs/screenshots/ and tests/browser_screenshots.py check every
explorer as the notebooks draw it. Marked ``browser``: needs Chromium and playwright.
"""

from __future__ import annotations

import os

import pytest
import torch

from browser_support import launch_browser, missing_reason
from figure_layout import EXPLORER_WIDTH, OUTPUT_WIDTH, problems, render

REQUIRED = os.environ.get("LABSUPPORT_REQUIRE_BROWSER", "") not in ("", "0")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(missing_reason() is not None and not REQUIRED,
                                 reason=f"figure layout test: {missing_reason()}")]


@pytest.fixture(scope="module")
def page():
    if missing_reason() is not None:
        pytest.fail(f"LABSUPPORT_REQUIRE_BROWSER is set but {missing_reason()}")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser, page = launch_browser(pw)
        yield page
        browser.close()


def speculative_speedup():
    from labsupport.plots.speculative import speedup_figure
    return speedup_figure(["prompt lookup, k=4, T=0.0 (grounded)"], [1.55], [2.33], [4.47], current=0)


def verify_pass():
    from labsupport.plots.speculative import verify_pass_figure
    return verify_pass_figure([" The", " light", "house", " keeper"], [" climbed", " the", " narrow", " hill"],
                              [" climbed", " the", " narrow", " stairs", " every"], 3)


def k_curve():
    from labsupport.plots.speculative_k import k_curve_figure
    curves = {"prompt lookup, grounded task": {k: 1 + 0.3 * k - 0.03 * k * k for k in range(9)},
              "int4 self-draft, creative task": {k: 1 + 0.1 * k - 0.02 * k * k for k in range(9)}}
    return k_curve_figure(curves, {name: max(c, key=c.get) for name, c in curves.items()}, used_k=4)


def kv_cache_memory():
    from labsupport.engine.config import PRESETS
    from labsupport.plots.kv_cache import cache_memory_figure
    return cache_memory_figure(PRESETS["smollm2-135m"], [64, 256, 1024, 4096], measured=[(256, 6 * 2 ** 20)],
                               highlight_length=1024)


def int4_packing():
    from labsupport.explorers.quantization import packing_figure
    return packing_figure(torch.linspace(-0.5, 1.0, 32), shown=8)


def twelve_serving_settings():
    from labsupport.explorers.serving import setting_label, short_label
    from labsupport.plots.serving_settings import settings_figure
    keys = [(load, policy, budget, prefix) for load in ("90% of capacity", "50% of capacity", "150% of capacity")
            for policy, budget, prefix in (("continuous", 32, False), ("continuous", 32, True),
                                           ("continuous", None, False), ("static", None, False))]
    rows = [{"label": short_label(*k), "name": setting_label(*k), "policy": k[1], "throughput": 10.0 + i,
             "ttft_p50": 0.1, "latency_p50": 0.2, "latency_p99": 0.4 + i / 3, "itl_p99": 0.05}
            for i, k in enumerate(keys)]
    return settings_figure(rows, current=rows[0]["label"])


def serving_timeline(tiny_llama):
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_workload import make_workload
    from labsupport.plots.serving import phase_timeline_figure
    requests = make_workload([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 10, 11]], count=8, median_new_tokens=6,
                             max_new_tokens=12, seed=3)
    result = Engine(tiny_llama, max_slots=4, block_size=4, token_budget=8).run(requests, clock="steps")
    title = ("continuous · budget 8 · no prefix cache · 90% of capacity<br><sup>124 tokens at 19.7 tokens/s; "
             "inter-token latency p99 136 ms<br>458 prompt tokens computed, 0 from the prefix cache</sup>")
    return phase_timeline_figure(result, clock="steps", title=title)


def stack_explorer_figure(tiny_llama):
    from labsupport.explorers.stack import stack_explorer
    from labsupport.lab.serving_workload import make_workload
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 9, 4)]
    requests = make_workload(prompts, median_new_tokens=4, max_new_tokens=6, min_new_tokens=2, seed=2)
    explorer = stack_explorer(tiny_llama, requests, slots=2, agreement_tokens=list(range(20)), use_widget=False)
    return explorer.figures[0].figure


def stack_ladder():
    from labsupport.plots.stack import cumulative_figure
    names = ["naive loop", "+ KV cache", "+ static batching", "+ bf16", "+ int4 weights", "+ int4, batch 1",
             "+ speculative decoding", "+ continuous batching", "Hugging Face generate()"]
    stages = [{"stage": n, "cumulative": 1.0 + 2 * i, "tokens_per_s": 5.0 * (1 + i), "precision": "float32",
               "gain": None if i == 0 else 1.3, "builds_on": None if i == 0 else names[i - 1], "kept": True}
              for i, n in enumerate(names)]
    return cumulative_figure({"stages": stages, "requests": 8, "tokens": 186, "device": "cpu"})


def prefill_attention():
    from labsupport.plots.long_context import prefill_attention_figure
    rows = [{"T": t, "memory": "computed", "naive_bytes": 4 * t * t, "fused_bytes": 64 * t,
             "naive_s": 1e-6 * t if t < 4000 else None, "fused_s": 5e-7 * t} for t in (256, 1024, 4096)]
    return prefill_attention_figure(rows, budget_bytes=2 ** 26)


def tensor_parallel_degrees():
    from labsupport.plots.tensor_parallel import degrees_figure
    degrees = {w: {"threads_per_rank": 2 // w, "decode_tokens_per_s": 20.0 / w, "prefill_s": 0.4 + 0.1 * w,
                   "all_reduce_share_of_decode": 0.3 * (w - 1), "all_reduce_share_of_prefill": 0.05 * (w - 1)}
               for w in (1, 2)}
    return degrees_figure({"prefill_tokens": 512, "cores": 2, "degrees": degrees})


def handover():
    from labsupport.plots.tensor_parallel import handover_figure
    rows = [{"arrival": 0.3 * i, "prefill_from": 0.3 * i + 0.01, "first_token": 0.3 * i + 0.1,
             "received": 0.3 * i + 0.12, "seated": 0.3 * i + 0.2, "finished": 0.3 * i + 1.1} for i in range(8)]
    return handover_figure(rows)


CASES = {"01 KV cache memory": (kv_cache_memory, OUTPUT_WIDTH),
         "04 int4 packing": (int4_packing, EXPLORER_WIDTH),
         "05 speedup": (speculative_speedup, EXPLORER_WIDTH),
         "05 one verify pass": (verify_pass, OUTPUT_WIDTH),
         "05 expected speedup against k": (k_curve, OUTPUT_WIDTH),
         "06 every setting so far (12)": (twelve_serving_settings, EXPLORER_WIDTH),
         "06 timeline with its subtitle": (serving_timeline, EXPLORER_WIDTH),
         "07 stack explorer": (stack_explorer_figure, EXPLORER_WIDTH),
         "07 the ladder": (stack_ladder, OUTPUT_WIDTH),
         "08 prefill attention": (prefill_attention, OUTPUT_WIDTH),
         "10 per degree, a legend entry per phase": (tensor_parallel_degrees, OUTPUT_WIDTH),
         "10 the handover": (handover, OUTPUT_WIDTH)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_figure_reads_cleanly_at_a_laptops_width(page, name, request):
    build, width = CASES[name]
    needs_model = "tiny_llama" in build.__code__.co_varnames[:build.__code__.co_argcount]
    figure = build(request.getfixturevalue("tiny_llama")) if needs_model else build()
    render(page, figure, width)
    found = problems(page)
    assert not found, "\n".join(found)


def test_the_check_sees_a_legend_on_a_title_and_labels_that_run_together(page):
    """The checker itself can fail: plotly's legend above the plot, wrapping into the title, and
    long horizontal category labels on narrow bars."""
    import plotly.graph_objects as go
    figure = go.Figure([go.Bar(x=[f"a long category name {i}" for i in range(8)], y=list(range(8)),
                               name=f"a rather long legend entry, number {j}") for j in range(6)])
    figure.update_layout(title="a title as long as the notebooks' titles are, under the legend", legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                         xaxis_tickangle=0)
    render(page, figure, EXPLORER_WIDTH)
    found = problems(page)
    assert any("a title as long" in p and "overlaps the legend" in p for p in found)
    assert any("tick label of xtick 'a long category name 0' overlaps" in p for p in found)
