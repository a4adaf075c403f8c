"""The compiled decode step (engine/compiled.py): buckets and one compile per bucket, the cache
marked static so that a CUDA graph may write it, what each generation reports, and every fallback
said out loud. Compiles are counted with a counting backend (it runs the traced graph as is, so its
tokens equal eager ones); one test compiles with inductor on this CPU, the embedded model's is slow."""

import time

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from labsupport.engine import compiled as compiled_module
from labsupport.engine.compiled import (CUDA_GRAPHS, SHARED, CompiledDecoder, bucket_length, bucket_rows,
                                        mark_static)
from labsupport.engine.generation import choose_decoder, generate
from labsupport.engine.kv_cache import StaticKVCache
from labsupport.engine.kv_quant import Int8KVCache
from labsupport.errors import LabError
from labsupport.weights.fixtures import lively_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

PROMPT = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture
def model():
    """Weights scaled up (varied tokens), float64 (the full-buffer attention of the fixed-shape step
    rounds like the eager one), a new one per test (the decoders keep state per model)."""
    return lively_model("tiny-llama", seed=3).to(torch.float64)


def prompts_of(lengths):
    return [[(7 * i + 3 * n) % 250 for i in range(n)] for n in lengths]


def test_buckets_round_rows_and_lengths_up():
    assert [bucket_rows(b) for b in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert [bucket_length(n, 8192) for n in (1, 64, 65, 200, 4097)] == [64, 64, 128, 256, 8192]
    assert bucket_length(300, 256) == 256                     # never past the model's context


def test_one_compile_per_bucket_across_many_lengths_and_batches(model):
    counter = CompileCounter()
    decoder = CompiledDecoder(backend=counter)
    shapes, buckets, reported = [], set(), 0
    for lengths in ([3], [9], [30], [3, 5], [40, 2, 7], [12, 12, 12, 12], [50], [61]):
        batch = prompts_of(lengths)
        result = generate(model, batch, 4, eos_token_ids=(), compile=decoder)
        assert result.decode_path == "compiled" and result.decode_note is None
        assert result.tokens.tolist() == generate(model, batch, 4, eos_token_ids=()).tokens.tolist()
        shapes.append((len(lengths), max(lengths) + 4))
        buckets.add((bucket_rows(len(lengths)), bucket_length(max(lengths) + 4, model.config.max_position)))
        reported += result.compiles
    assert len(set(shapes)) == 8 and len(buckets) == 4
    assert counter.frame_count == len(buckets) == reported    # one graph per bucket, each reported once
    again = generate(model, prompts_of([20, 9]), 4, eos_token_ids=(), compile=decoder)
    assert again.compiles == 0 and again.warmup_seconds == 0.0 and counter.frame_count == len(buckets)
    assert len(decoder._caches[model]) == len(buckets)        # one cache per bucket, reused
    assert not any(name.startswith("_compiled") for name in vars(model))     # nothing set on the model


def test_the_bucket_cache_is_reused_and_comes_back_empty(model):
    decoder = CompiledDecoder(backend=CompileCounter())
    first = decoder.cache_for(model, 3, 20)
    assert (first.batch_size, first.max_len) == (4, 64)
    first.reserve(5)
    second = decoder.cache_for(model, 4, 60)
    assert second is first and second.length == 0
    assert decoder.cache_for(model.to(torch.float32), 3, 20).dtype == torch.float32   # not another dtype's


def test_the_caches_kept_fit_the_budget_the_least_recently_used_dropped_first(model):
    """Issue 51, item 1: a sweep of batch sizes kept a cache per point and nothing released them.
    Caches of one (model, purpose) now fit `keep_bytes` together: two shapes timed in turn stay
    (batch 1 against batch 16), the oldest goes first, a cache larger than the budget is made
    alone, and another purpose's caches (speculative decoding's, in use at once) are never dropped."""
    from labsupport.engine.compiled import cache_bytes
    one, two, four = (cache_bytes(model.config, rows, 20, model.dtype) for rows in (1, 2, 4))
    decoder = CompiledDecoder(backend=CompileCounter(), keep_bytes=two + four)
    small, large = decoder.cache_for(model, 1, 20), decoder.cache_for(model, 4, 20)
    verify = decoder.cache_for(model, 8, 20, purpose="verify")               # bigger than the budget: alone
    assert decoder.cache_for(model, 1, 20) is small and decoder.cache_for(model, 3, 20) is large   # both kept
    pair = decoder.cache_for(model, 2, 20)                                    # 1 and 4 do not fit beside it
    assert decoder.held_bytes(model) == two + four + verify.nbytes and pair.nbytes == two
    assert decoder.cache_for(model, 4, 20) is large and decoder.cache_for(model, 1, 20) is not small   # the oldest went
    assert decoder.cache_for(model, 8, 20, purpose="verify") is verify
    alone = CompiledDecoder(backend=CompileCounter(), keep_bytes=0)           # one cache per (model, purpose)
    alone.cache_for(model, 1, 20), alone.cache_for(model, 2, 200)
    assert list(alone._caches[model]) == [(2, 256, "decode")]
    for bad in (-1, 1.5, "1 GiB"):
        with pytest.raises(LabError, match="keep_bytes must be") as error:
            CompiledDecoder(keep_bytes=bad)
        assert "\n" not in str(error.value)


def test_sampling_draws_for_the_real_rows_only(model):
    """Padding rows of a bucket never draw random numbers: seeded sampling gives the eager tokens."""
    from labsupport.engine.sampling import SamplingConfig
    sampling = SamplingConfig(temperature=1.0, top_k=40, seed=11)
    batch = prompts_of([6, 9, 4])                                # 3 rows in a bucket of 4
    eager = generate(model, batch, 8, sampling, eos_token_ids=())
    compiled = generate(model, batch, 8, sampling, eos_token_ids=(), compile=CompiledDecoder(backend=CompileCounter()))
    assert compiled.tokens.tolist() == eager.tokens.tolist()


def test_the_compiled_step_adds_its_buckets_rows_itself(model):
    """generate hands the compiled step its own rows (3 here, in a bucket of 4), as it hands the
    eager one: the step pads to the bucket and gives back 3 rows of logits, the eager step's; the
    prefill writes only the batch's rows, so the extra row's prompt slots stay as they were."""
    from labsupport.engine.generation import decode_step, prefill
    decoder = CompiledDecoder(backend=CompileCounter())
    tokens = torch.tensor(prompts_of([6, 6, 6]))                                      # (3, 6)
    bucket = decoder.cache_for(model, 3, 12)
    decoder.warm_up(model, bucket)
    plain = StaticKVCache.for_model(model, 3, 12)
    extra_row = bucket.keys[:, 3].clone()
    prefill(model, tokens, bucket), prefill(model, tokens, plain)
    assert bucket.batch_size == 4 and torch.equal(bucket.keys[:, 3], extra_row)
    for token in (7, 8):
        step_tokens = torch.full((3,), token)
        compiled = decoder.step(model, bucket, step_tokens)
        eager = decode_step(model, plain, step_tokens)
        assert compiled.shape == (3, model.config.vocab_size)
        torch.testing.assert_close(compiled, eager)
    assert bucket.length == plain.length == 8


def test_the_warm_up_is_reported_apart_from_the_decode_seconds(model):
    """Item 9a: a backend that takes a second to compile shows in warmup_seconds, never in decode speed."""
    def slow_backend(graph, example_inputs):
        time.sleep(1.0)
        return graph.forward
    result = generate(model, PROMPT, 6, eos_token_ids=(), compile=CompiledDecoder(backend=slow_backend))
    assert result.warmup_seconds >= 1.0 and result.decode_seconds < 0.5 and result.compiles == 1


def test_generate_picks_the_path_once_before_its_loop(model, monkeypatch):
    from labsupport.engine import generation
    decoder = CompiledDecoder(backend=CompileCounter())
    calls = []
    original = decoder.step
    monkeypatch.setattr(decoder, "step", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(generation, "decode_step", lambda *a, **k: pytest.fail("an eager step on the compiled path"))
    result = generate(model, PROMPT, 9, eos_token_ids=(), compile=decoder)
    assert result.decode_path == "compiled" and len(calls) == 1 + 8     # one warm-up call, then 8 steps


def test_the_cache_is_marked_static_and_cuda_graphs_would_accept_its_writes(model):
    """The compiled step mutates the cache; cudagraph trees skip a graph that mutates an input
    outside its static inputs (torch/_inductor/cudagraph_utils.py). Capture the graph's AOT
    metadata on this CPU and ask torch's own check, with and without the marks."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._guards import TracingContext
    from torch._inductor.cudagraph_utils import check_for_mutation_ignore_cuda_graph_managed_tensor
    from torch.utils._ordered_set import OrderedSet

    verdicts = []

    def backend(graph, example_inputs):
        def forward_compiler(fx, inputs):
            meta = TracingContext.get().fw_metadata
            mutated = OrderedSet(i for i, info in enumerate(meta.input_info) if info.mutates_data)
            with torch._inductor.config.patch({"triton.cudagraph_trees": True}):
                verdicts.append((len(mutated), check_for_mutation_ignore_cuda_graph_managed_tensor(
                    fx, OrderedSet(), mutated, meta.static_input_indices)))
            return fx.forward
        return aot_module_simplified(graph, example_inputs, fw_compiler=forward_compiler)

    cache = StaticKVCache.for_model(model, 1, 16)
    assert getattr(cache.keys, "_dynamo_static_input_type", None) is None
    CompiledDecoder(backend=backend).warm_up(model, cache)
    assert cache.keys._dynamo_static_input_type == cache.values._dynamo_static_input_type == "unguarded"
    assert verdicts == [(2, None)]                  # keys and values mutated, both static: no skip
    unmarked = StaticKVCache.for_model(model, 1, 32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_module, "mark_static", lambda cache: None)
        CompiledDecoder(backend=backend).warm_up(model, unmarked)
    assert "skipping cudagraphs due to mutated inputs (2 instances)" in verdicts[-1][1]


def test_a_failing_compile_falls_back_in_one_warning_and_says_so_in_every_result(model, monkeypatch):
    decoder = CompiledDecoder(backend=CompileCounter())

    def no_compiler(device_type):
        raise RuntimeError("Cannot find a working triton installation.\nmore details")
    monkeypatch.setattr(decoder, "_step_fn", no_compiler)
    plain = generate(model, PROMPT, 10, eos_token_ids=())
    with pytest.warns(UserWarning, match=r"^Compiled decoding is not available here \(Cannot find a working triton"):
        fallback = generate(model, PROMPT, 10, eos_token_ids=(), compile=decoder)
    assert fallback.row(0) == plain.row(0) and fallback.decode_path == "eager" and fallback.warmup_seconds == 0.0
    assert fallback.decode_note.startswith("Compiled decoding is not available here (Cannot find a working triton")
    again = generate(model, PROMPT, 10, eos_token_ids=(), compile=decoder)      # not tried again, still said
    assert again.decode_path == "eager" and again.decode_note == fallback.decode_note


def test_the_recompile_limit_is_reported_never_silent(model, monkeypatch):
    counter = CompileCounter()
    decoder = CompiledDecoder(backend=counter)
    entries = len(torch._dynamo.eval_frame._debug_get_cache_entry_list(compiled_module.fixed_shape_step.__code__))
    monkeypatch.setattr(compiled_module, "RECOMPILE_LIMIT", entries + 1)        # room for one more graph
    assert generate(model, PROMPT, 4, eos_token_ids=(), compile=decoder).decode_path == "compiled"
    with pytest.warns(UserWarning, match="recompile limit"):
        past = generate(model, prompts_of([70]), 4, eos_token_ids=(), compile=decoder)   # another bucket
    assert past.decode_path == "eager" and "recompile limit" in past.decode_note and counter.frame_count == 1
    assert past.tokens.tolist() == generate(model, prompts_of([70]), 4, eos_token_ids=()).tokens.tolist()


def test_a_compile_while_decoding_is_counted_and_said(model, monkeypatch):
    """Should a step recompile after the warm-up (a guard torch did not expect), the result counts it
    and says so: that compile's seconds are in decode_seconds."""
    from torch._dynamo.utils import counters
    decoder = CompiledDecoder(backend=CompileCounter())
    original, calls = decoder.step, []

    def step_that_recompiles(*args):
        calls.append(1)
        if len(calls) == 3:                                   # the warm-up, then the second real step
            counters["stats"]["unique_graphs"] += 1
        return original(*args)
    monkeypatch.setattr(decoder, "step", step_that_recompiles)
    with pytest.warns(UserWarning, match=r"compiled 1 more time\(s\) while decoding"):
        result = generate(model, PROMPT, 6, eos_token_ids=(), compile=decoder)
    assert result.compiles == 2 and "while decoding" in result.decode_note and result.decode_path == "compiled"


class _CudaCache(StaticKVCache):
    """A CPU cache that says it lives on CUDA: for the warm-up's report on a simulated GPU."""

    @property
    def device(self):
        return torch.device("cuda")


@pytest.mark.parametrize("skips, recorded, path", [(0, 4, CUDA_GRAPHS), (1, 0, "compiled"), (0, 0, "compiled")])
def test_on_cuda_a_skipped_cuda_graph_shows_in_the_path_and_a_warning(model, monkeypatch, skips, recorded, path):
    from simulated_gpu import GPUS, simulated
    from torch._dynamo.utils import counters
    decoder = CompiledDecoder()

    def fake_step(model, cache, *args):                 # what torch counts while it compiles and records
        counters["inductor"]["cudagraph_skips"] += skips
        counters["inductor"]["cudagraph_recorded_non_static_inputs"] += recorded
    monkeypatch.setattr(decoder, "step", fake_step)
    cache = _CudaCache(model.config, 1, 16, dtype=model.dtype)
    with simulated(GPUS["H100"]):
        if path == CUDA_GRAPHS:
            report = decoder.warm_up(model, cache)
        else:
            with pytest.warns(UserWarning, match="runs without CUDA graphs here"):
                report = decoder.warm_up(model, cache)
    assert report.path == path and report.cudagraph_skips == skips * 3    # three warm-up calls on CUDA
    assert (report.note is None) == (path == CUDA_GRAPHS)
    assert cache.keys._dynamo_static_input_type == "unguarded"


def test_swapped_layers_on_the_same_model_warm_up_again_and_get_their_own_path(model, monkeypatch):
    """Issue 51, item 3: notebook 04 swaps quantized layers into the same model; the verdict was
    kept per (model, cache, width), so each variant compiled inside its first timed decode under
    fp32's "CUDA graphs" label. The verdict is now kept per `layer_signature` too: a swap warms up
    afresh and its path is derived again; swapping back finds the first verdict, with no new calls."""
    import copy

    from simulated_gpu import GPUS, simulated
    from torch._dynamo.utils import counters
    decoder, calls, skipping = CompiledDecoder(), [], []

    def fake_step(model, cache, *args):                 # graphs recorded, or skipped once a layer is swapped
        calls.append(1)
        counters["inductor"]["cudagraph_skips" if skipping else "cudagraph_recorded_non_static_inputs"] += 1
    monkeypatch.setattr(decoder, "step", fake_step)
    cache = _CudaCache(model.config, 1, 16, dtype=model.dtype)
    original = model.blocks[0].mlp.down
    with simulated(GPUS["H100"]):
        assert decoder.warm_up(model, cache).path == CUDA_GRAPHS and len(calls) == 3
        assert decoder.warm_up(model, cache).path == CUDA_GRAPHS and len(calls) == 3     # known: no new calls
        model.blocks[0].mlp.down = copy.deepcopy(original)                            # a swapped layer
        skipping.append(True)
        with pytest.warns(UserWarning, match="runs without CUDA graphs here"):
            swapped = decoder.warm_up(model, cache)
        assert len(calls) == 6 and swapped.path == "compiled" and swapped.cudagraph_skips == 3
        model.blocks[0].mlp.down = original                                           # swapped back
        assert decoder.warm_up(model, cache).path == CUDA_GRAPHS and len(calls) == 6


def test_on_cuda_generate_compiles_by_default_with_cuda_graphs(monkeypatch):
    from simulated_gpu import GPUS, simulated
    seen = {}
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: seen.update(kwargs) or fn)
    with simulated(GPUS["T4"]):
        assert choose_decoder(None, "cuda", 64, None) is SHARED
        assert choose_decoder(None, "cuda", 8, None) is None                # too short to pay back
        assert choose_decoder(None, "cpu", 1000, None) is None
        assert CompiledDecoder()._step_fn("cuda") is compiled_module.fixed_shape_step
    assert seen == {"backend": "inductor", "fullgraph": True, "dynamic": False,
                    "options": {"triton.cudagraphs": True}}
    frozen = CompiledDecoder(inductor_options={"freezing": True})
    assert frozen.options_for("cuda") == {"freezing": True, "triton.cudagraphs": True}
    assert frozen.options_for("cpu") == {"freezing": True} and SHARED.options_for("cpu") is None
    assert CompiledDecoder(inductor_options={"triton.cudagraphs": False}).options_for("cuda") == {
        "triton.cudagraphs": False}


def test_caches_without_fixed_shape_writes_and_bad_switches_get_one_sentence(model):
    int8 = Int8KVCache.for_model(model, 1, 20)
    assert choose_decoder(None, "cuda", 64, int8) is None                   # auto: eager for such a cache
    for compile, words in ((True, "fixed-shape writes"), ("yes", "compile must be True, False, None"),
                           (CompiledDecoder(backend=CompileCounter()), "fixed-shape writes")):
        with pytest.raises(LabError, match=words) as error:
            generate(model, PROMPT, 8, cache=Int8KVCache.for_model(model, 1, 20), compile=compile)
        assert "\n" not in str(error.value)
    with pytest.raises(LabError, match="inductor_options must be a dict"):
        CompiledDecoder(inductor_options=["freezing"])


def test_compiled_tokens_equal_eager_tokens_with_inductor_on_this_cpu():
    model = lively_model("tiny-llama", seed=3)
    decoder = CompiledDecoder()
    for prompt in (PROMPT, [PROMPT, [9, 8, 7]]):                      # one bucket of 1 row, one of 2
        eager = generate(model, prompt, 12, eos_token_ids=(), return_logits=True)
        first = generate(model, prompt, 12, eos_token_ids=(), compile=decoder, return_logits=True)
        assert first.tokens.tolist() == eager.tokens.tolist()
        for a, b in zip(first.logits, eager.logits):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert first.decode_path == "compiled" and first.compiles == 1 and first.warmup_seconds > 0
        again = generate(model, prompt, 12, eos_token_ids=(), compile=decoder)
        assert again.tokens.tolist() == eager.tokens.tolist() and again.compiles == 0
        assert again.warmup_seconds == 0.0


@pytest.mark.slow
def test_embedded_compiled_tokens_equal_eager_tokens(smollm):
    model, tok = smollm
    ids = tok.encode("The three most useful facts about the ocean are")
    decoder = CompiledDecoder()
    for prompt in (ids, [ids, ids[:5]]):
        eager = generate(model, prompt, 16, eos_token_ids=())
        compiled = generate(model, prompt, 16, eos_token_ids=(), compile=decoder)
        assert compiled.decode_path == "compiled" and compiled.tokens.tolist() == eager.tokens.tolist()
    decoder.release(model)
    assert model not in decoder._caches


def test_mark_static_marks_the_layer_index_too(model):
    cache = StaticKVCache.for_model(model, 2, 8)
    mark_static(cache)
    assert all(t._dynamo_static_input_type == "unguarded" for t in (cache.keys, cache.values, cache.layer_ids))
