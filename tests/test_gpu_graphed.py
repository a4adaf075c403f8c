"""On a GPU every timed decode is a replayed CUDA graph, for every contender alike (issue 35).

On simulated GPUs (tests/simulated_gpu.py: no CUDA tensor can exist), `generate` and the Hugging
Face runs are replaced by spies that record what they were asked for and return a fake result.
Each lab helper and bench section must ask for the graphed step (compile=True) on CUDA and stay
eager on a CPU, and a result that was not graphed on CUDA must be refused or marked failed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from labsupport.engine.compiled import CUDA_GRAPHS, DecodePath
from labsupport.errors import LabError
from labsupport.lab import measure
from labsupport.lab.measure import HF_GRAPHED, NOT_GRAPHED, mark_graphed, require_graphed, timed_compile
from simulated_gpu import GPUS, simulated

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture(params=["T4", "H100"])
def gpu(request):
    with simulated(GPUS[request.param]) as simulated_gpu:
        yield simulated_gpu


def fake_result(batch: int, new_tokens: int, path: str):
    """What a spy's `generate` returns: the fields the timing code reads."""
    return SimpleNamespace(tokens=torch.zeros(batch, new_tokens, dtype=torch.long), decode_path=path,
                           decode_seconds=0.01, prefill_seconds=0.001, warmup_seconds=2.0, decode_note=None,
                           new_token_counts=[new_tokens] * batch, decode_tokens_per_s=100.0,
                           row=lambda i=0: [0] * new_tokens)


def spy_generate(monkeypatch, module, asked: list, path=None):
    """Replace `module.generate` with a spy: records compile=, returns a fake result whose decode
    path is `path`, or what the compile asked for would give on a GPU (True: CUDA graphs)."""
    def spy(model, prompts, n, *args, compile=False, **kwargs):
        asked.append(compile)
        batch = len(prompts) if prompts and isinstance(prompts[0], (list, tuple)) else 1
        return fake_result(batch, n, path or (CUDA_GRAPHS if compile else "eager"))
    monkeypatch.setattr(module, "generate", spy)


def fake_model(device):
    return SimpleNamespace(device=device, dtype=torch.float32, config=SimpleNamespace(name="fake"))


# --- the rule's one home: lab/measure.py ---------------------------------------------------------

def test_timed_compile_is_graphed_on_cuda_and_eager_on_a_cpu(gpu):
    assert timed_compile(CUDA) is True and timed_compile("cpu") is False


def test_require_graphed_refuses_an_ungraphed_result_on_cuda_only(gpu):
    eager = fake_result(1, 4, "eager")
    with pytest.raises(LabError, match="ours.*not as a replayed CUDA graph.*failed measurement"):
        require_graphed(eager, "ours", CUDA)
    with pytest.raises(LabError, match="compiled"):
        require_graphed("compiled", "ours", CUDA)          # compiled, but no CUDA graphs
    assert require_graphed(eager, "ours", CPU) is eager
    assert require_graphed(CUDA_GRAPHS, "ours", CUDA) == CUDA_GRAPHS
    assert require_graphed(HF_GRAPHED, "theirs", CUDA) == HF_GRAPHED


def test_mark_graphed_fails_a_figure_with_an_ungraphed_path_on_cuda(gpu):
    figure = {"name": "x", "met": True, "note": "n"}
    assert mark_graphed(dict(figure), [CUDA_GRAPHS, HF_GRAPHED], CUDA)["graphed"] is True
    failed = mark_graphed(dict(figure), [CUDA_GRAPHS, NOT_GRAPHED], CUDA)
    assert failed["graphed"] is False and failed["met"] is None and failed["note"].startswith("failed measurement")
    on_cpu = mark_graphed(dict(figure), ["eager"], CPU)
    assert on_cpu["met"] is True and "graphed" not in on_cpu and on_cpu["paths"] == ["eager"]


def test_captured_runs_the_pass_itself_on_a_cpu_and_refuses_a_failed_capture_on_cuda(gpu):
    def fn():
        return 1
    assert measure.captured(fn, CPU, "a pass") is fn
    # no CUDA stream can be made here, as a pass that cannot be captured: a failed measurement
    with pytest.raises(LabError, match="the 3-token verify pass could not be captured"):
        measure.captured(fn, CUDA, "the 3-token verify pass")


# --- lab helpers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_batch_timing_asks_for_the_graphed_step_on_cuda(gpu, monkeypatch, device):
    from labsupport.lab import batching_timing
    asked = []
    spy_generate(monkeypatch, batching_timing, asked)
    model = fake_model(torch.device(device))
    row = batching_timing.measure_batch(model, [[1, 2]] * 2, new_tokens=4, repeats=2, warmup=0)
    batching_timing.batch_speedup(model, [1, 2], batch=4, new_tokens=4, warmup=1, repeats=1)
    assert asked and set(asked) == {device == "cuda"}
    assert row["decode_path"] == (CUDA_GRAPHS if device == "cuda" else "eager")
    assert row["warmup_s"] == (2.0 * 3 if device == "cuda" else 2.0 * 2)   # reported apart


def test_batch_timing_refuses_an_ungraphed_decode_on_cuda(gpu, monkeypatch):
    from labsupport.lab import batching_timing
    spy_generate(monkeypatch, batching_timing, [], path="compiled")
    with pytest.raises(LabError, match="batch 2"):
        batching_timing.measure_batch(fake_model(CUDA), [[1, 2]] * 2, new_tokens=4, repeats=1, warmup=0)
    with pytest.raises(LabError, match="batch 1"):
        batching_timing.batch_speedup(fake_model(CUDA), [1, 2], batch=4, new_tokens=4, warmup=1, repeats=1)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_precision_decode_run_is_graphed_on_cuda(gpu, monkeypatch, device):
    from labsupport.engine import generation
    from labsupport.lab.precision import decode_run
    asked = []
    spy_generate(monkeypatch, generation, asked)
    decode_run(fake_model(torch.device(device)), [1, 2], 4)()
    assert asked == [device == "cuda"]
    spy_generate(monkeypatch, generation, [], path="eager")
    if device == "cuda":
        with pytest.raises(LabError, match="decode"):
            decode_run(fake_model(CUDA), [1, 2], 4)()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_stacks_generate_stages_are_graphed_and_its_own_loops_say_not_graphed(gpu, monkeypatch, device):
    from labsupport.engine.serving.request import Request
    from labsupport.lab import stack
    asked = []
    spy_generate(monkeypatch, stack, asked)
    model = fake_model(torch.device(device))
    variants = SimpleNamespace(get=lambda *a, **k: model)
    requests = [Request([1, 2, 3], max_new_tokens=4, request_id=i) for i in range(3)]
    for batching in ("none", "static"):
        paths: set = set()
        stack.serve_fn(variants, requests, batching=batching, slots=2, paths=paths)()
        assert paths == {CUDA_GRAPHS if device == "cuda" else "eager"}
    assert asked and set(asked) == {device == "cuda"}
    naive = []
    monkeypatch.setattr(stack, "generate_naive", lambda *a, **k: naive.append(1) or fake_result(1, 4, "eager"))
    paths = set()
    stack.serve_fn(variants, requests, kv_cache=False, paths=paths)()
    assert naive and paths == {NOT_GRAPHED if device == "cuda" else "eager"}


# --- bench sections -------------------------------------------------------------------------------

def records_graphs(run):
    """`run`, bumping torch's count of recorded CUDA graphs as a compiled (reduce-overhead) run's first
    call does on a GPU: the bench labels Hugging Face's rows by that count (`bench.core.GraphCount`)."""
    from torch._dynamo.utils import counters

    def recorded(*args, **kwargs):
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += 1
        return run(*args, **kwargs)
    return recorded


def _fake_hf(asked: list, name: str):
    """A spy for a huggingface.hf_*_fn: records its arguments, returns a run giving (1, prompt + n) ids
    (the static one's recording CUDA graphs, as on a GPU)."""
    def make(hf, ids, n, *args, **kwargs):
        asked.append((name, kwargs))
        run = lambda: torch.zeros(1, len(ids) + n, dtype=torch.long)   # noqa: E731
        return records_graphs(run) if name == "static" else run
    return make


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_engines_rows_are_graphed_on_cuda_hf_included(gpu, monkeypatch, device):
    from labsupport.bench import engines
    asked, hf_asked = [], []
    spy_generate(monkeypatch, engines, asked)
    monkeypatch.setattr(engines, "hf_generate_fn", _fake_hf(hf_asked, "dynamic"))
    monkeypatch.setattr(engines, "hf_static_compiled_fn", _fake_hf(hf_asked, "static"))
    monkeypatch.setattr(engines, "quantized_bytes", lambda m: 1)
    model = SimpleNamespace(weight_bytes=lambda: 1)
    handle = SimpleNamespace(describe=lambda: "aten int4 kernel")
    ctx = SimpleNamespace(device=torch.device(device), model=lambda dtype: (model, None), hf_model=lambda dtype: "hf",
                          variants=SimpleNamespace(get=lambda *a, **k: model, handle=lambda *a, **k: handle))
    options = engines.EnginesOptions(new_tokens=4, repeats=1, compile=False, llamacpp=False)
    paths: dict = {}
    found, absent, compile_s, _ = engines._engines(ctx, options, [1, 2], paths)
    for name, (run, _) in found.items():
        run(4)
    on_gpu = device == "cuda"
    assert asked and set(asked) == {on_gpu}
    assert {name for name, _ in hf_asked} == {"static" if on_gpu else "dynamic"}
    assert paths[engines.HF] == {HF_GRAPHED if on_gpu else "eager"}
    assert paths[engines.OURS] == {CUDA_GRAPHS if on_gpu else "eager"}
    if on_gpu:
        assert engines.HF in compile_s and compile_s[engines.OURS] > 0          # compiling, apart
        assert engines.OURS_COMPILED in absent and engines.HF_STATIC in absent


def test_engines_figures_fail_where_a_row_was_not_graphed_on_cuda(gpu):
    from labsupport.bench import engines

    def row(path):
        return {"tokens_per_s": 10.0, "decode_tokens_per_s": 10.0, "tokens_agreeing_with_labsupport_fp32": 4,
                "bandwidth_fraction": 0.5, "read_bandwidth_fraction": 0.6, "weight_bytes_per_step": 1e6,
                "decode_paths": [path]}
    rows = {engines.OURS: row(CUDA_GRAPHS), engines.HF: row(HF_GRAPHED), engines.HF_LOOKUP: row(NOT_GRAPHED)}
    figures = {f["name"]: f for f in engines._figures(rows, {}, None, CUDA)}
    assert figures[f"{engines.OURS} / {engines.HF} (tokens/s)"]["graphed"] is True
    lookup = figures[f"{engines.HF_LOOKUP}: fraction of copy bandwidth in decode"]
    assert lookup["graphed"] is False and lookup["met"] is None


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_batching_versus_huggingface_is_graphed_on_both_sides(gpu, monkeypatch, device):
    from labsupport.bench import batching
    asked, hf_asked = [], []
    spy_generate(monkeypatch, batching, asked)

    def hf_padded(hf, padded, n, graphed=False):
        hf_asked.append(graphed)
        run = lambda: torch.zeros(2, n, dtype=torch.long)   # noqa: E731
        return records_graphs(run) if graphed else run
    monkeypatch.setattr(batching, "hf_padded_generate_fn", hf_padded)
    _, tokens = batching.versus_huggingface(fake_model(torch.device(device)), "hf", [[1, 2], [3, 4]], None, 4,
                                            repeats=1)
    on_gpu = device == "cuda"
    assert set(asked) == {on_gpu} and set(hf_asked) == {on_gpu}
    assert tokens["paths"]["huggingface"] == {HF_GRAPHED if on_gpu else "eager"}


def test_compiled_decode_refuses_a_compiled_step_without_cuda_graphs_on_cuda(gpu, monkeypatch):
    from labsupport.bench import compiled_decode
    spy_generate(monkeypatch, compiled_decode, [], path="compiled")
    said = compiled_decode.compare_compiled(fake_model(CUDA), [[1, 2]], 4, CUDA, repeats=1)
    assert isinstance(said, str) and "failed measurement" in said


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_stacks_hf_peer_is_its_static_cache_and_compile_on_cuda(gpu, monkeypatch, device):
    from labsupport.bench.peers import huggingface
    from labsupport.engine.serving.request import Request
    hf_asked = []
    monkeypatch.setattr(huggingface, "hf_generate_fn", _fake_hf(hf_asked, "dynamic"))
    monkeypatch.setattr(huggingface, "hf_static_compiled_fn", _fake_hf(hf_asked, "static"))
    stage = huggingface.hf_stack_stage(SimpleNamespace(device=torch.device(device)), [Request([1, 2], 3, request_id=0)])
    assert stage.run() == {0: [0, 0, 0]}
    on_gpu = device == "cuda"
    assert {name for name, _ in hf_asked} == {"static" if on_gpu else "dynamic"}
    assert stage.decode_paths == {HF_GRAPHED if on_gpu else "eager"}


@pytest.mark.parametrize("path", [CUDA_GRAPHS, "eager"])
def test_baseline_asks_for_the_graphed_step_on_cuda_and_refuses_an_eager_one(gpu, monkeypatch, path):
    from labsupport.bench import baseline
    asked, hf_asked = [], []
    spy_generate(monkeypatch, baseline, asked, path=path)
    monkeypatch.setattr(baseline, "hf_generate_fn", _fake_hf(hf_asked, "dynamic"))
    monkeypatch.setattr(baseline, "hf_static_compiled_fn", _fake_hf(hf_asked, "static"))
    monkeypatch.setattr(baseline, "copy_timing", lambda device, repeats: (8, None))
    real_ones, real_empty = torch.ones, torch.empty_like          # the copy probe's buffers, on the CPU here
    monkeypatch.setattr(baseline.torch, "ones", lambda *a, device=None, **k: real_ones(*a, **k))
    monkeypatch.setattr(baseline.torch, "empty_like", lambda t, **k: real_empty(t))
    monkeypatch.setattr(baseline, "track_peak_memory", lambda device: measure.track_peak_memory("cpu"))
    model = SimpleNamespace(weight_bytes=lambda: 1, config=SimpleNamespace(), dtype=torch.float32)
    monkeypatch.setattr(baseline, "kv_cache_bytes", lambda *a: 1)
    tok = SimpleNamespace(encode=lambda text: [1, 2, 3])
    monkeypatch.setattr(baseline, "chat_prompt", lambda tok, text: text)
    ctx = SimpleNamespace(device=CUDA, model=lambda dtype: (model, tok), hf_model=lambda dtype: "hf",
                          hardware=SimpleNamespace(bandwidth=1e9))
    options = baseline.BaselineOptions(new_tokens=4, repeats=1)
    if path != CUDA_GRAPHS:
        with pytest.raises(LabError, match="labsupport generate"):
            baseline.section_baseline(ctx, options)
        return
    section = baseline.section_baseline(ctx, options)
    assert set(asked) == {True} and {name for name, _ in hf_asked} == {"static"}
    assert section["decode_paths"] == {"labsupport": [CUDA_GRAPHS], "huggingface": [HF_GRAPHED]}
    assert all(f["graphed"] for f in section["figures"])


def test_an_engines_row_that_cannot_be_graphed_is_absent_as_a_failed_measurement(gpu, monkeypatch):
    from labsupport.bench import engines
    spy_generate(monkeypatch, engines, [], path="compiled")
    monkeypatch.setattr(engines, "hf_static_compiled_fn", _fake_hf([], "static"))
    monkeypatch.setattr(engines, "quantized_bytes", lambda m: 1)
    model = SimpleNamespace(weight_bytes=lambda: 1)
    handle = SimpleNamespace(describe=lambda: "aten int4 kernel")
    ctx = SimpleNamespace(device=CUDA, model=lambda dtype: (model, None), hf_model=lambda dtype: "hf",
                          variants=SimpleNamespace(get=lambda *a, **k: model, handle=lambda *a, **k: handle))
    found, absent, _, _ = engines._engines(ctx, engines.EnginesOptions(new_tokens=4, repeats=1, llamacpp=False),
                                           [1, 2])
    assert engines.OURS not in found and "failed measurement" in absent[engines.OURS]
    assert engines.HF in found


# --- speculative decoding: the draft's steps and the verify passes, graphed alike ------------------

def spy_speculative(monkeypatch, module, asked: list, path=None):
    """Replace `module.speculative_generate` with a spy: records compile=, returns a result that
    says `path`, or what the compile asked for would give on a GPU (True: CUDA graphs)."""
    from labsupport.engine.speculative import SpeculativeResult, SpeculativeStats

    def spy(target, draft, prompt, n, *args, compile=False, **kwargs):
        asked.append(compile)
        said = path or (CUDA_GRAPHS if compile else "eager")
        stats = SpeculativeStats(drafted=n, accepted=n - 1, rejected=1, replaced=1, target_calls=2,
                                 draft_seconds=0.001, target_seconds=0.002)
        return SpeculativeResult(tokens=[0] * n, prompt_length=len(prompt), stats=stats, seconds=0.01,
                                 path=DecodePath(said, warmup_seconds=1.5), verify_path=said, draft_path=None)
    monkeypatch.setattr(module, "speculative_generate", spy)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_stacks_speculative_stage_is_graphed_on_cuda(gpu, monkeypatch, device):
    from labsupport.engine import speculative
    from labsupport.engine.serving.request import Request
    from labsupport.lab import stack
    asked = []
    spy_speculative(monkeypatch, speculative, asked)
    model = fake_model(torch.device(device))
    variants = SimpleNamespace(get=lambda *a, **k: model)
    requests = [Request([1, 2, 3], max_new_tokens=4, request_id=i) for i in range(2)]
    paths: set = set()
    assert stack.serve_fn(variants, requests, speculative=True, paths=paths)() == {0: [0] * 4, 1: [0] * 4}
    assert asked == [device == "cuda"] * 2 and paths == {CUDA_GRAPHS if device == "cuda" else "eager"}
    if device == "cuda":
        spy_speculative(monkeypatch, speculative, [], path="eager")
        with pytest.raises(LabError, match="speculative decoding.*failed measurement"):
            stack.serve_fn(variants, requests, speculative=True)()


@pytest.mark.parametrize("device, path", [("cuda", CUDA_GRAPHS), ("cuda", "compiled"), ("cpu", None)])
def test_the_speculative_sections_own_loops_are_graphed_on_cuda(gpu, monkeypatch, device, path):
    from contextlib import contextmanager

    from labsupport.bench import speculative as section
    asked, spec_asked, hf_asked = [], [], []
    spy_generate(monkeypatch, section, asked)
    spy_speculative(monkeypatch, section, spec_asked, path=path)
    monkeypatch.setattr(section, "hf_generate_fn", _fake_hf(hf_asked, "dynamic"))
    monkeypatch.setattr(section, "hf_static_compiled_fn", _fake_hf(hf_asked, "static"))
    monkeypatch.setattr(section, "chat_prompt", lambda tok, text: text)

    @contextmanager
    def passes(hf):
        yield SimpleNamespace(tokens=[3], seconds=[0.01])
    monkeypatch.setattr(section, "ForwardPasses", passes)
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=260, name="fake"))
    tok = SimpleNamespace(encode=lambda text: [1, 2, 3], decode=lambda ids, **k: "text")
    ctx = SimpleNamespace(device=torch.device(device), model=lambda dtype: (model, tok), hf_model=lambda dtype: "hf",
                          variants=SimpleNamespace(get=lambda *a, **k: model))
    result = section.section_speculative(ctx, section.SpeculativeOptions(new_tokens=4, repeats=1))
    on_gpu = device == "cuda"
    assert set(asked) == set(spec_asked) == {on_gpu}
    said = path or "eager"
    assert result["decode_paths"]["lookup"] == result["decode_paths"]["int4 self-draft"] == [said]
    assert result["tasks"]["grounded"]["paths"]["lookup"]["verify_path"] == said
    assert result["compile_s"]["lookup"] > 0                                   # reported apart
    ours = [f for f in result["figures"] if f["name"].startswith(("prompt lookup speedup", "int4 self-draft"))]
    assert len(ours) == 4
    for figure in ours:
        assert figure["paths"] == sorted({said, CUDA_GRAPHS if on_gpu else "eager"})
        if on_gpu:
            assert figure["graphed"] is (path == CUDA_GRAPHS)


# --- the explorers time what their notebooks time: graphed on a GPU -------------------------------


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_speculative_explorer_times_both_sides_graphed_on_cuda(gpu, monkeypatch, device):
    from labsupport.explorers import speculative as explorer
    asked, spec_asked = [], []
    spy_generate(monkeypatch, explorer, asked)
    spy_speculative(monkeypatch, explorer, spec_asked)
    monkeypatch.setattr(explorer, "chat_prompt", lambda tok, text: text)
    tok = SimpleNamespace(encode=lambda text: [1, 2, 3])
    view = explorer.speculative_explorer(fake_model(torch.device(device)), tok, {"lookup": object()},
                                         {"grounded": "text"}, new_tokens=4, repeats=1, use_widget=False)
    assert len(view.figures) == 2 and view.status.value == ""      # rendered when made
    assert set(asked) == set(spec_asked) == {device == "cuda"} and asked and spec_asked
    if device == "cuda":                                   # an eager result is a failed measurement
        spy_speculative(monkeypatch, explorer, [], path="eager")
        view = explorer.speculative_explorer(fake_model(CUDA), tok, {"lookup": object()}, {"grounded": "text"},
                                             new_tokens=4, repeats=1, use_widget=False)
        assert not view.figures and "lookup draft" in view.status.value
        assert "failed measurement" in view.status.value


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_quantize_explorers_decodes_are_graphed_on_cuda(gpu, monkeypatch, device):
    from labsupport.explorers import quantization as explorer
    asked, store = [], []
    spy_generate(monkeypatch, explorer, asked)
    lab = explorer.QuantizeLab.__new__(explorer.QuantizeLab)          # only what _decode reads
    lab.prompt_ids, lab.new_tokens = [1, 2], 4
    lab._decode(fake_model(torch.device(device)), None, store)()
    assert asked == [device == "cuda"] and store == [0.01]
    if device == "cuda":
        spy_generate(monkeypatch, explorer, [], path="eager")
        with pytest.raises(LabError, match="float decode.*failed measurement"):
            lab._decode(fake_model(CUDA), None, store)()
