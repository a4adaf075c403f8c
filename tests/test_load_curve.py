"""Notebook 06's load curve (`lab.load_curve`) and its peers (`bench.peers.continuous_batching`): the rows a
sweep returns, the figures of a peer computed from its token times, vLLM's row where it cannot run
(and, with a simulated vllm module, where it can)."""

import math
import sys
import types

import pytest
import torch

from labsupport.bench.serving import our_servers
from labsupport.bench.peers.continuous_batching import hf_serve, vllm_serve, vllm_skip_reason
from labsupport.errors import LabError
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import Request
from labsupport.lab.serving_workload import make_workload
from labsupport.lab.load_curve import (KEYS, configurations, curve_of, engine_row, fit_to_load, load_curve,
                                       near_saturation, peer_row, saturation_rate)
from labsupport.lab.serving_metrics import summarize

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11], [1, 2, 3, 4, 5, 6, 7, 8, 12]]


def test_configurations_name_the_four_engine_settings():
    settings = configurations(16)
    assert list(settings) == ["static", "continuous", "chunked prefill", "chunked + prefix caching"]
    assert settings["chunked prefill"] == {"policy": "continuous", "token_budget": 16}
    assert settings["chunked + prefix caching"]["prefix_caching"] is True
    assert "prefix_caching" not in settings["continuous"] and "token_budget" not in settings["static"]
    assert our_servers(16)["prefix caching"] == {"policy": "continuous", "prefix_caching": True}
    with pytest.raises(LabError, match="token_budget"):
        configurations(2.5)


def test_a_sweep_gives_one_row_per_configuration_and_rate(tiny_llama):
    served = []

    def fake_peer(requests):                       # a peer reports when each token came out
        served.append([r.arrival for r in requests])
        return {"arrivals": {r.request_id: r.arrival for r in requests},
                "token_times": {r.request_id: [r.arrival + 1 + k for k in range(r.max_new_tokens)]
                                for r in requests}}

    rows = load_curve(tiny_llama, PROMPTS, rates=[50.0, 5.0], count=5, max_slots=2, token_budget=6, block_size=4,
                      median_new_tokens=3, max_new_tokens=6, peer=fake_peer)
    names = ["static", "continuous", "chunked prefill", "chunked + prefix caching", "Hugging Face"]
    assert [(r["configuration"], r["rate"]) for r in rows] == [(n, rate) for rate in (50.0, 5.0) for n in names]
    tokens = sum(r.max_new_tokens for r in make_workload(PROMPTS, count=5, median_new_tokens=3, max_new_tokens=6))
    assert all(set(KEYS) <= set(r) and r["tokens"] == tokens and r["requests"] == 5 for r in rows)
    ours = [r for r in rows if r["configuration"] != "Hugging Face"]
    assert all(r["throughput"] > 0 and r["ttft_p50"] <= r["ttft_p99"] and r["itl_p50"] <= r["itl_p99"] for r in ours)
    computed = {r["configuration"]: r["prefill_tokens"] for r in ours if r["rate"] == 5.0}
    # the same prompts computed whole without the cache; the shared 8-token prefix (two blocks of 4) reused with it
    whole = sum(len(PROMPTS[i % 3]) for i in range(5))
    assert computed["static"] == computed["continuous"] == computed["chunked prefill"] == whole
    assert computed["chunked + prefix caching"] < computed["chunked prefill"]
    # the same seeded workload at every rate: only the arrival times change, spread out 10x at a 10x lower rate
    assert len(served) == 2 and served[1][-1] == pytest.approx(10 * served[0][-1])
    assert curve_of(rows, "continuous", "rate") == ([5.0, 50.0], [5.0, 50.0])


def test_a_sweep_refuses_bad_rates(tiny_llama):
    for rates in ([], [0.0], [-1.0], [float("nan")]):
        with pytest.raises(LabError):
            load_curve(tiny_llama, PROMPTS, rates=rates, count=2, max_slots=2, token_budget=4)


LOADS = {"50% of capacity": 0.5, "90% of capacity": 0.9, "200% of capacity": 2.0}


@pytest.mark.parametrize("kind", ["cpu", "gpu"], ids=["cpu preset", "cuda preset"])
def test_a_busy_machine_gets_a_smaller_load_curve_and_a_sentence_saying_so(monkeypatch, kind):
    """Issue 52, item 5: 06b's curve ran past 20 minutes at a load of 9 to 14 per core. The load is
    read from the operating system (patched here), and past busy.LOAD_LIMIT the sweep shrinks."""
    from labsupport.lab import busy
    from labsupport.lab.workloads import SERVING_PRESETS
    sizes = SERVING_PRESETS[kind]
    monkeypatch.setattr(busy, "usable_cores", lambda: 2)
    monkeypatch.setattr(busy.os, "getloadavg", lambda: (24.0, 20.0, 18.0), raising=False)
    small, loads, note = fit_to_load(sizes, LOADS, busy.load_per_core())
    assert small.curve_requests < sizes.curve_requests and small.curve_requests >= 2 * small.curve_slots
    assert small.curve_max_new_tokens == sizes.curve_max_new_tokens // 2
    assert 1 <= small.curve_median_new_tokens <= small.curve_max_new_tokens
    assert small.curve_slots == sizes.curve_slots and small.token_budget == sizes.token_budget
    assert loads == {"90% of capacity": 0.9, "200% of capacity": 2.0}          # near saturation, and overloaded
    assert small.curve_loads == (90, 200)
    assert "busy" in note and "12.0 per core" in note and f"{small.curve_requests} requests instead of" in note
    assert "\n" not in note and max(len(s.split()) for s in note.split(". ")) <= 35


@pytest.mark.parametrize("load", [None, 0.0, 0.9, 1.5])
def test_a_quiet_machine_or_an_unknown_load_keeps_the_whole_curve(load):
    from labsupport.lab.workloads import SERVING_PRESETS
    sizes = SERVING_PRESETS["cpu"]
    assert fit_to_load(sizes, LOADS, load) == (sizes, LOADS, None)


def test_fit_to_load_refuses_what_it_cannot_read():
    from labsupport.lab.workloads import SERVING_PRESETS
    sizes = SERVING_PRESETS["cpu"]
    for bad in ({"sizes": {"curve_requests": 12}}, {"loads": {}}, {"loads": [0.5]}, {"loads": {"x": -1.0}},
                {"load": float("nan")}, {"load": -2.0}, {"load": "busy"}):
        arguments = {"sizes": sizes, "loads": LOADS, "load": 3.0, **bad}
        with pytest.raises(LabError) as caught:
            fit_to_load(**arguments)
        assert "\n" not in str(caught.value)


def test_a_sweep_can_draw_a_progress_bar_one_step_per_run(tiny_llama, capsys):
    rows = load_curve(tiny_llama, PROMPTS, rates=[50.0], count=2, max_slots=2, token_budget=6, block_size=4,
                      median_new_tokens=2, max_new_tokens=3, progress=True)
    out = capsys.readouterr().out
    assert len(rows) == 4 and "load curve" in out and "4/4" in out and "done" in out
    with pytest.raises(LabError, match="progress takes True"):
        load_curve(tiny_llama, PROMPTS, rates=[50.0], count=2, max_slots=2, token_budget=6, progress="yes")


def test_engine_row_and_the_saturation_rate(tiny_llama):
    from labsupport.engine.serving import Engine
    requests = make_workload(PROMPTS, count=4, median_new_tokens=3, max_new_tokens=5)
    result = Engine(tiny_llama, max_slots=2, block_size=4).run(requests, clock="steps")
    row = engine_row(result)
    assert row["throughput"] == pytest.approx(sum(r.max_new_tokens for r in requests) / summarize(result)["duration"])
    assert row["prefill_tokens"] == sum(len(r.prompt) for r in requests) and row["cached_tokens"] == 0
    assert saturation_rate(tiny_llama, requests, max_slots=2, block_size=4) > 0


def test_peer_row_computes_the_same_figures_from_token_times():
    row = peer_row({0: 0.0, 1: 1.0}, {0: [0.5, 0.7, 1.0], 1: [1.5, 1.6]})
    assert row["throughput"] == pytest.approx(5 / 1.6)
    assert row["ttft_p50"] == pytest.approx(0.5) and row["ttft_p99"] == pytest.approx(0.5)
    assert row["itl_p50"] == pytest.approx(0.2) and row["itl_p99"] == pytest.approx(0.298)
    assert row["tpot_p50"] == pytest.approx((0.25 + 0.1) / 2)
    assert math.isnan(row["prefill_tokens"])
    assert all(math.isnan(v) for v in peer_row({0: 0.0}, {0: []}).values())


def test_near_saturation_picks_the_highest_rate_not_above_it():
    rows = [{"rate": r} for r in (0.4, 0.9, 1.5)]
    assert near_saturation(rows, 1.0) == 0.9
    assert near_saturation(rows, 0.2) == 0.4


# --- the peers --------------------------------------------------------------------------------

def test_hf_serve_compares_greedy_requests_only():
    sampled = [Request([1, 2, 3], max_new_tokens=2, sampling=SamplingConfig(temperature=0.8, seed=1))]
    with pytest.raises(LabError, match="greedy"):
        hf_serve(None, sampled)


def test_vllm_row_says_why_it_was_skipped_on_a_cpu():
    requests = [Request([1, 2, 3], max_new_tokens=2, request_id=0)]
    row = vllm_serve("no-model-needed", requests, "cpu")
    assert row["skipped"] == vllm_skip_reason("cpu") and row["skipped"].startswith("vLLM skipped: it needs a CUDA GPU")
    assert row["skipped"].count(".") == 1 and row["tokens"] == {} and math.isnan(row["tokens_per_s"])


def test_vllm_row_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)                    # import vllm raises ImportError
    assert "not installed" in vllm_skip_reason("cuda")


def test_vllm_row_with_a_simulated_vllm(monkeypatch):
    calls = {}

    class SamplingParams:
        def __init__(self, temperature, max_tokens, ignore_eos):
            self.temperature, self.max_tokens, self.ignore_eos = temperature, max_tokens, ignore_eos

    class LLM:
        def __init__(self, model, **kwargs):
            calls["model"], calls["kwargs"] = model, kwargs

        def generate(self, prompts, params, use_tqdm=False):
            calls.setdefault("generate", []).append(params)
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=[7] * p.max_tokens)]) for p in params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    free = {"bytes": 100 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 140 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    requests = [Request([1, 2, 3], max_new_tokens=n, request_id=i) for i, n in enumerate([2, 3])]
    row = vllm_serve("/models/x", requests, "cuda", max_slots=4, reference={0: [7, 7], 1: [7, 7, 8]},
                     dtype="float16")
    assert row["skipped"] is None and row["server"] == "vLLM"
    assert row["tokens"] == {0: [7, 7], 1: [7, 7, 7]} and row["same_tokens"] == (1, 2)
    assert row["tokens_per_s"] > 0 and calls["model"] == "/models/x" and calls["kwargs"]["max_num_seqs"] == 4 and calls["kwargs"]["dtype"] == "float16"
    assert calls["kwargs"]["enable_prefix_caching"] is False                  # as our plain continuous row
    assert calls["kwargs"]["gpu_memory_utilization"] == 0.5                   # half the card: 70 of 100 GiB free
    assert row["config"] == "float16, prefix caching off, 50% of the GPU"
    timed = calls["generate"][-1]
    assert [p.max_tokens for p in timed] == [2, 3] and all(p.temperature == 0 and p.ignore_eos for p in timed)
    with pytest.raises(LabError, match="greedy"):
        vllm_serve("/models/x", [Request([1], max_new_tokens=2, sampling=SamplingConfig(temperature=1.0, seed=0))],
                   "cuda")

    def broken(self, prompts, params, use_tqdm=False):
        raise RuntimeError("no kernel for float32")

    monkeypatch.setattr(LLM, "generate", broken)
    row = vllm_serve("/models/x", requests, "cuda")
    assert row["skipped"] == "vLLM skipped: it failed to serve this model (RuntimeError: no kernel for float32)."
    assert row["tokens"] == {}
    free["bytes"] = 10 * 2**30                                              # earlier sections hold the rest
    row = vllm_serve("/models/x", requests, "cuda")
    assert row["skipped"].startswith("vLLM skipped: less than a tenth of the GPU's memory is free")


def test_vllm_takes_most_of_the_free_memory_and_never_more_than_half_the_card():
    from labsupport.bench.peers.continuous_batching import vllm_memory_fraction
    gib = 2**30
    assert vllm_memory_fraction(140 * gib, 140 * gib) == 0.5
    assert vllm_memory_fraction(50 * gib, 140 * gib) == round(0.8 * 50 / 140, 3)
    assert vllm_memory_fraction(13 * gib, 140 * gib) is None


def test_the_hf_cache_page_field_is_read_from_the_config_class():
    import dataclasses

    from labsupport.bench.peers.continuous_batching import _page_field

    @dataclasses.dataclass
    class Old:                        # transformers 5.17
        block_size: int = 256

    @dataclasses.dataclass
    class New:                        # later 5.x
        page_size: int = 256
    assert _page_field(Old) == "block_size" and _page_field(New) == "page_size"


def test_an_old_transformers_without_continuous_batching_is_one_sentence(monkeypatch):
    import transformers.generation.configuration_utils as utils
    monkeypatch.delattr(utils, "ContinuousBatchingConfig")
    with pytest.raises(LabError, match="needs a transformers with ContinuousBatchingConfig"):
        hf_serve(None, [Request([1, 2], max_new_tokens=2)])


def test_serve_side_by_side_times_every_server_on_the_same_requests(tiny_llama):
    from labsupport.bench.serving import OURS, serve_side_by_side
    requests = make_workload(PROMPTS, count=4, median_new_tokens=3, max_new_tokens=5)
    timings, runs = serve_side_by_side(tiny_llama, None, requests, slots=2, token_budget=4)
    assert list(timings) == list(runs) == list(OURS)                  # no Hugging Face model: no "hf"
    assert runs["chunked + prefix caching"].token_budget == 4 and runs["prefix caching"].prefix_caching
    assert all(runs[name].tokens() == runs["continuous"].tokens() for name in OURS)
    timings, runs = serve_side_by_side(tiny_llama, None, requests, slots=2)
    assert list(timings) == ["static", "continuous"]


@pytest.mark.parametrize("has_switch", [True, False], ids=["auto_switch_to_flash field", "older transformers"])
def test_the_hf_server_never_switches_to_flash_attention(monkeypatch, has_switch):
    """transformers turns a model to FlashAttention by itself (fp32 included) where flash_attn is
    installed: with the config field it is switched off and SDPA kept unprefixed ("paged|sdpa"
    goes away in 5.23); without it the model gets paged SDPA, which it leaves alone."""
    import dataclasses
    from types import SimpleNamespace

    from labsupport.bench.peers import continuous_batching

    fields = [("page_size", int, 16), ("max_requests_per_batch", int, 8), ("num_blocks", int, 1),
              ("max_batch_tokens", object, None), ("allow_block_sharing", bool, True), ("use_cuda_graph", bool, True)]
    if has_switch:
        fields.append(("auto_switch_to_flash", bool, True))
    Config = dataclasses.make_dataclass("Config", [(n, t, dataclasses.field(default=d)) for n, t, d in fields])
    monkeypatch.setattr(continuous_batching, "_continuous_batching_config_class", lambda: Config)
    seen = {}

    class Model:
        config = SimpleNamespace(_attn_implementation="sdpa")
        generation_config = SimpleNamespace(eos_token_id=2, pad_token_id=None, max_new_tokens=1, do_sample=False)
        device = torch.device("cpu")

        def set_attn_implementation(self, name):
            seen.setdefault("attention", []).append(name)
            self.config._attn_implementation = name

        def init_continuous_batching(self, generation_config, continuous_batching_config):
            seen["config"] = continuous_batching_config
            raise RuntimeError("stop here")

    requests = make_workload([[1, 2, 3]], count=1, median_new_tokens=2, max_new_tokens=2, seed=0)
    with pytest.raises(RuntimeError, match="stop here"):
        hf_serve(Model(), requests, max_slots=2)
    if has_switch:
        assert seen["config"].auto_switch_to_flash is False and "attention" not in seen
    else:
        assert seen["attention"] == ["paged|sdpa", "sdpa"]              # for the run, then put back
