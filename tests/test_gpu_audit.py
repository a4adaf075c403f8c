"""Issue 51: what an audit of the course against torch 2.11's source found around the CUDA graphs,
each tested on this CPU by patching (no GPU here): a failed bench row or section is recorded and
the run goes on (item 2), a decode path re-derived when a model's layers are swapped (item 3),
cuDNN attention off on sm90 and newer (item 6), and CUDA graphs counted, not asserted (item 7)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from labsupport.bench.core import BenchContext

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


# --- item 2: a failed row or section is recorded, the run goes on -------------------------------

@pytest.fixture(scope="module")
def context():
    return BenchContext(torch.device("cpu"), model_name="tiny-llama")


def test_a_quantization_row_whose_decode_raises_is_failed_and_the_others_are_written(context, monkeypatch):
    import labsupport.bench.quantization as bench_quantization
    from labsupport.bench.quantization import QuantizationOptions, section_quantization
    from labsupport.claims import quantization_section_claims
    broken = context.timing_variants.get("float32", "int4", group_size=32)
    real = bench_quantization.generate

    def generate(model, *args, **kwargs):
        if model is broken:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore lines")
        return real(model, *args, **kwargs)
    monkeypatch.setattr(bench_quantization, "generate", generate)
    section = section_quantization(context, QuantizationOptions(new_tokens=3, slow_new_tokens=2, repeats=1,
                                                                eval_tokens=16))
    rows, figures = section["rows"], {f["name"]: f for f in section["figures"]}
    failed = rows["int4 g32"]
    assert failed["failed"] == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert failed["decode_speedup"] is None and failed["speed_note"].startswith("failed: RuntimeError")
    assert failed["perplexity"] > 0                                   # its memory and quality still measured
    figure = figures["int4 g32 / fp32 decode speed (batch 1): failed"]
    assert math.isnan(figure["value"]) and figure["met"] is None and "\n" not in figure["note"]
    for name in ("int8", "int4 g128", "bf16"):                       # the other rows are timed
        assert rows[name]["decode_speedup"] > 0 and "failed" not in rows[name]
    claims = quantization_section_claims(section)
    assert any(c["weights"] == "int4 g32" and c["verdict"] == "not timed here" for c in claims)


def test_a_row_whose_quality_raises_is_failed_and_not_timed(context, monkeypatch):
    import labsupport.bench.quantization as bench_quantization
    from labsupport.bench.quantization import QuantizationOptions, section_quantization
    broken = context.variants.get("float32", "int8")
    real = bench_quantization.logits_of

    def logits_of(model, ids):
        if model is broken:
            raise ValueError("bad")
        return real(model, ids)
    monkeypatch.setattr(bench_quantization, "logits_of", logits_of)
    section = section_quantization(context, QuantizationOptions(new_tokens=2, slow_new_tokens=2, repeats=1,
                                                                eval_tokens=16))
    row = section["rows"]["int8"]
    assert row["failed"] == "ValueError: bad" and "decode_speedup" not in row
    assert "int8: failed" in {f["name"] for f in section["figures"]}
    assert section["rows"]["int4 g32"]["decode_speedup"] > 0


def test_bitsandbytes_rows_decode_eager_and_say_so_where_the_others_are_graphed(monkeypatch):
    """LLM.int8() reads its outliers on the host, which no CUDA graph captures: the bnb rows are
    timed eager (compile=False) even where the others are graphed, their path saying why."""
    import labsupport.bench.quantization as bench_quantization
    from labsupport.engine.compiled import DecodePath
    from labsupport.engine.generation import GenerationResult
    asked = []

    def generate(model, ids, tokens, eos_token_ids, compile):
        asked.append(compile)
        return GenerationResult(torch.zeros(1, tokens, dtype=torch.long), len(ids), [tokens], 0.0, 1.0,
                                path=DecodePath())
    monkeypatch.setattr(bench_quantization, "generate", generate)
    decodes = bench_quantization._Decodes(torch.device("cpu"), {"bnb int8": object(), "bnb nf4": object()}, [1, 2],
                                          graphed=True)
    for name in bench_quantization.EAGER_ROWS:
        decodes.decode(name, 4)()
        assert decodes.paths[name] == {bench_quantization.EAGER_LABEL} and "CUDA graphs" not in decodes.paths[name]
    assert asked == [False, False] and not decodes.failed


def test_a_section_that_raises_is_recorded_and_the_suite_goes_on(monkeypatch):
    from labsupport.bench import suite
    from labsupport.report import html_report

    def raises(ctx, options):
        raise RuntimeError("cannot be captured: outliers.any()\ntraceback lines")
    ran = []
    monkeypatch.setitem(suite.SECTIONS, "baseline", replace(suite.SECTIONS["baseline"], run=raises))
    monkeypatch.setitem(suite.SECTIONS, "roofline", replace(suite.SECTIONS["roofline"], claims=None,
                                                            run=lambda ctx, options: ran.append(1) or {"figures": []}))
    monkeypatch.setattr(suite, "machine_info", lambda ctx: {"device": "cpu"})
    said = []
    report = suite.run(["baseline", "roofline"], device="cpu", model_name="tiny-llama", progress=said.append)
    failed = report["sections"]["baseline"]
    assert failed["failed"] == "RuntimeError: cannot be captured: outliers.any()" and "claims" not in failed
    assert failed["figures"][0]["name"] == "section baseline: failed" and failed["seconds"] >= 0
    assert ran == [1] and "seconds" in report["sections"]["roofline"]
    assert any("baseline failed" in line for line in said)
    assert "section baseline: failed" in html_report(report)


# --- item 6: cuDNN attention off on compute capability 9.0 and newer ---------------------------

@pytest.mark.parametrize("capability, off", [((9, 0), True), ((10, 0), True), ((8, 0), False), ((7, 5), False)])
def test_cudnn_attention_is_turned_off_from_sm90_once(monkeypatch, capability, off):
    """torch 2.11 picks cuDNN attention first on sm90, and it builds a plan for every new prefill
    shape: the first `pick_device` that hands out such a GPU turns it off, and the runtime note
    says so; an A100 or a T4 keeps torch's default. Once only: a learner may turn it back on."""
    from simulated_gpu import GPUS, simulated

    from labsupport.delivery import describe_runtime
    from labsupport.engine import hardware
    before = torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(hardware, "_attention_configured", False)
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        with simulated(replace(GPUS["H100"], capability=capability)):
            assert hardware.pick_device() == torch.device("cuda")
            assert torch.backends.cuda.cudnn_sdp_enabled() is not off
            assert hardware.cudnn_attention_off("cuda") is off
            assert ("cuDNN attention off" in hardware.attention_note("cuda")) is off
            assert ("cuDNN attention off" in describe_runtime("cuda")) is off      # every notebook's first line
            torch.backends.cuda.enable_cudnn_sdp(True)                   # the learner's choice is kept
            hardware.pick_device("cuda:0")
            assert torch.backends.cuda.cudnn_sdp_enabled() and hardware.attention_note("cuda") == ""
        assert hardware.pick_device("cpu").type == "cpu" and hardware.attention_note("cpu") == ""
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


# --- item 7: Hugging Face's rows are labelled by torch's counts, not by assertion ---------------

@pytest.mark.parametrize("skips, recorded, graphed", [(0, 2, True), (1, 2, False), (0, 0, False)])
def test_a_hugging_face_row_is_labelled_by_torchs_counts_as_ours_is(skips, recorded, graphed):
    """The bench said "CUDA graphs" of every Hugging Face row on a GPU because it asked for them.
    `GraphCount` reads the counts our decoder's warm-up reads, around HF's compiling run: a row
    whose graphs torch skipped, or never recorded, says so, and `mark_graphed` fails its figure."""
    from simulated_gpu import GPUS, simulated
    from torch._dynamo.utils import counters

    from labsupport.bench.core import GraphCount, reported
    from labsupport.engine.compiled import CUDA_GRAPHS, graphs_verdict
    from labsupport.lab.measure import HF_GRAPHED, mark_graphed
    with GraphCount() as count:                       # what HF's first (compiling, recording) run bumps
        counters["inductor"]["cudagraph_skips"] += skips
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += recorded
    assert (count.skips, count.recorded, count.compiles) == (skips, recorded, 0)
    path = count.hf_path(graphed=True)
    assert (path == HF_GRAPHED) is graphed is (graphs_verdict(skips, recorded) is None)     # our own rule
    assert graphed or f"torch skipped {skips}" in path
    with simulated(GPUS["H100"]):
        figure = mark_graphed(reported("labsupport / HF generate", 1.2, "x", target=1.0), [CUDA_GRAPHS, path], "cuda")
    assert figure["graphed"] is graphed and (figure["met"] is None) is not graphed
    assert count.hf_path(graphed=False) == "eager"


def _hf_run_bumping(skips: int, recorded: int, shape=(1, 6)):
    """A Hugging Face run standing in for a compiled (reduce-overhead) one on a GPU: each call bumps
    torch's CUDA-graph counts as a first, compiling call would (skipped or recorded)."""
    from torch._dynamo.utils import counters

    def run():
        counters["inductor"]["cudagraph_skips"] += skips
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += recorded
        return torch.zeros(*shape, dtype=torch.long)
    return run


@pytest.mark.parametrize("skips, recorded, graphed", [(0, 1, True), (1, 1, False), (0, 0, False)])
def test_the_bench_rows_label_hugging_face_by_what_torch_counted_around_its_first_run(monkeypatch, skips, recorded,
                                                                                       graphed):
    """The engines row, the batching peer and the stack's peer asked HF for CUDA graphs and said
    "CUDA graphs" whatever torch did; now a run whose graphs were skipped (or never recorded) is
    labelled without them, and the figures reading it fail on a GPU (`mark_graphed`)."""
    from types import SimpleNamespace

    from simulated_gpu import GPUS, simulated

    from labsupport.bench import batching, engines
    from labsupport.bench.core import reported
    from labsupport.bench.peers import huggingface
    from labsupport.engine.serving.request import Request
    from labsupport.lab.measure import HF_GRAPHED, mark_graphed
    monkeypatch.setattr(engines, "hf_static_compiled_fn", lambda hf, ids, n: _hf_run_bumping(skips, recorded,
                                                                                              (1, len(ids) + n)))
    monkeypatch.setattr(batching, "hf_padded_generate_fn",
                        lambda hf, padded, n, graphed=False: _hf_run_bumping(skips, recorded, (2, n)))
    monkeypatch.setattr(huggingface, "hf_static_compiled_fn", lambda hf, ids, n: _hf_run_bumping(skips, recorded))
    cuda = torch.device("cuda")
    with simulated(GPUS["H100"]):
        rows = engines._Rows([1, 2], cuda, True, {})
        engines._hf_rows(rows, "hf", 1, engines.EnginesOptions(new_tokens=4, repeats=1, llamacpp=False))
        run_engine = rows.engines[engines.HF][0]
        assert run_engine(4) == [0] * 4 and run_engine(4) == [0] * 4         # a replay adds no count
        monkeypatch.setattr(batching, "generate", lambda *a, compile=False, **k: SimpleNamespace(
            tokens=torch.zeros(2, a[2], dtype=torch.long), decode_path="compiled + CUDA graphs", decode_note=None))
        _, tokens = batching.versus_huggingface(SimpleNamespace(device=cuda), "hf", [[1], [2]], None, 4, repeats=2)
        stage = huggingface.hf_stack_stage(SimpleNamespace(device=cuda), [Request([1, 2], 3, request_id=0)])
        stage.run()
        labels = [rows.paths[engines.HF], tokens["paths"]["huggingface"], stage.decode_paths]
        figure = mark_graphed(reported("labsupport / HF generate", 1.2, "x", target=1.0), labels[0], cuda)
    for label in labels:
        assert len(label) == 1 and (label == {HF_GRAPHED}) is graphed
        assert graphed or f"without CUDA graphs (torch skipped {skips}" in next(iter(label))
    assert figure["graphed"] is graphed and (figure["met"] is None) is not graphed
    from labsupport.lab.measure import ungraphed_paths      # notebook 07's row of that stage is flagged too
    assert bool(ungraphed_paths(labels[2])) is not graphed


# --- item 1: notebook 02's sweep is sized at the cache the compiled decoder allocates -----------

@pytest.mark.parametrize("free_gib", [9.5, 10.0, 10.5, 11.0, 11.25, 11.41, 12.0])
def test_notebook_02s_sweep_points_fit_at_their_bucketed_cache_on_a_t4(monkeypatch, free_gib):
    """On a T4 notebook 02 sweeps the 1.7B shape in fp16 (40 prompt tokens + 64 new ones), decoding
    through the compiled decoder, whose cache has the buckets' rows and positions (`cache_bytes`:
    128 positions, not 104). Sized at 104, it kept batch 256 from 9.5 GiB free on, whose real cache
    and activations take more than the 65% of the free memory a sweep may use below 11.3 GiB."""
    from simulated_gpu import GPUS, simulated
    from unittest import mock

    from labsupport.engine.compiled import bucket_rows, cache_bytes
    from labsupport.engine.config import PRESETS as MODELS
    from labsupport.lab import batching_timing
    from labsupport.lab.timing_model import HEADROOM
    config, dtype, prompt, new_tokens = MODELS["smollm2-1.7b-shape"], torch.float16, 40, 64
    swept = []
    monkeypatch.setattr(batching_timing, "measure_batch", lambda model, prompts, *a, **k: swept.append(len(prompts)))
    model = type("Timed", (), {"config": config, "dtype": dtype, "device": torch.device("cuda")})()
    free = int(free_gib * 2**30)
    with simulated(GPUS["T4"]), mock.patch.object(torch.cuda, "mem_get_info", return_value=(free, 15 * 2**30)), \
            pytest.warns(UserWarning, match="left out"):
        sweep = batching_timing.sweep_batch_sizes(model, [1] * prompt, [1, 16, 64, 128, 256, 512], new_tokens)
    assert swept and swept[0] == 1
    rows = bucket_rows(max(swept))            # the prefill's and the steps' activations, fp32 logits, twice
    activations = 2 * rows * (config.vocab_size * 4 + prompt * 3 * config.intermediate_size * 2)
    assert cache_bytes(config, max(swept), prompt + new_tokens, dtype) + activations <= HEADROOM * free, swept
    assert 512 not in swept and "512" in sweep.note and (256 in swept) is (free_gib >= 11.3)
    assert "128 positions" in sweep.note


def test_notebook_00s_roofline_sizes_its_exact_cache_not_the_buckets(monkeypatch):
    """sweep_decode times steps over a cache of exactly the context (`filled_cache`), so it sizes the
    sweep unbucketed: bucketed, a T4 lost batch 512 it can hold."""
    from labsupport.lab import roofline
    asked = []
    monkeypatch.setattr(roofline, "batches_that_fit", lambda *a, **k: (asked.append(k), (list(a[1]), None))[1])
    monkeypatch.setattr(roofline, "measure_decode_point", lambda model, batch, context, repeats: {"batch": batch})
    model = type("Timed", (), {"config": None, "dtype": torch.float16, "device": torch.device("cuda")})()
    roofline.sweep_decode(model, [1, 512], context=64)
    assert asked == [{"bucketed": False}]


# --- item 9: one transfer to the host per speculative step, not one per token -------------------

HOST_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


@pytest.fixture
def host_reads(monkeypatch):
    """Every read of a tensor's values by the host (on a GPU, each one waits for the queue), counted."""
    reads = []
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.mark.parametrize("compiled", [False, True])
def test_a_model_draft_reads_its_k_tokens_in_one_transfer(host_reads, compiled):
    """ModelDraft.propose read each drafted token with int() (k waits for the GPU per step); now the
    tokens stay on the device, each fed to the next step there, and come back in one `tolist`. The
    compiled path is the decoder's one-token step (a stand-in here: the eager pass, counted alike)."""
    from labsupport.engine.speculative import ModelDraft
    from labsupport.weights.fixtures import lively_model

    class Decoder:                                  # what ModelDraft._feed calls on the compiled path
        def step(self, model, cache, tokens, positions, key_mask):
            assert isinstance(tokens, torch.Tensor) and tokens.shape == (1,) and positions is None
            return model.logits(model(tokens[None], cache=cache), at=-1)          # (1, vocab)
    torch.manual_seed(0)
    draft = ModelDraft(lively_model())
    context = list(b"Hello world, hello")
    draft.start(context, 64, None)
    if compiled:
        draft._compiled = (Decoder(), draft.cache, torch.ones(1, draft.cache.max_len, dtype=torch.bool))
    host_reads.clear()
    tokens, probs = draft.propose(context, 4)
    assert host_reads == ["tolist"] and len(tokens) == 4 and all(isinstance(t, int) for t in tokens)
    assert probs is None and draft.cache.length == len(context) + 3            # d_4 is never fed


def test_greedy_verify_reads_the_targets_argmaxes_in_one_transfer(host_reads):
    """verify compared each drafted token with int(target_argmax[i]): one wait per token."""
    from labsupport.engine.speculative import verify
    argmax = torch.tensor([5, 6, 7, 8, 9])
    for drafted, expected in [([5, 6, 7, 8], (4, 9, "bonus")), ([5, 6, 0, 8], (2, 7, "corrected")),
                              ([], (0, 5, "bonus"))]:
        host_reads.clear()
        assert verify(None, argmax, drafted, None, None) == expected
        assert host_reads == ["tolist"]
