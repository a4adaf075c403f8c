"""Speculative decoding, compiled (notebook 05; engine/speculative.py with engine/compiled.py).

`speculative_generate(..., compile=True)` runs a model draft's steps as the compiled decode step
and every verify pass as one fixed-shape step of k + 1 tokens (shorter passes padded), as
`generate(..., compile=True)` does; on CUDA those are replayed CUDA graphs. Here, on a CPU,
inductor compiles them (slowly: one decoder for the module, so each graph compiles once), and
the tokens must be the target's own greedy tokens, or the eager path's samples for a seed.
Compile counts and fallbacks use a counting backend, as tests/test_compiled.py does.
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from labsupport.engine.compiled import CompiledDecoder
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import StaticKVCache
from labsupport.engine.kv_quant import Int8KVCache
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.speculative import ModelDraft, PromptLookupDraft, speculative_generate
from labsupport.errors import LabError
from labsupport.weights.fixtures import lively_model as lively

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

PROMPT = list(b"The cat sat on the mat. The cat")
NEW = 13                                  # not a multiple of k + 1 for k = 1, 3, 4: short last passes


@pytest.fixture(scope="module")
def target():
    return lively()


@pytest.fixture(scope="module")
def draft_model():
    return lively(noise=0.3)              # agrees with the target only partly: misses, corrections, bonuses


@pytest.fixture(scope="module")
def inductor():
    """One inductor decoder for the module: each (model, width) graph compiles once."""
    return CompiledDecoder()


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def drafts(draft_model):
    return {"model draft": ModelDraft(draft_model), "prompt lookup": PromptLookupDraft(ngram=2)}


@pytest.mark.parametrize("k", [1, 3, 4])
def test_compiled_greedy_equals_the_targets_greedy_generate(target, draft_model, inductor, k, one_thread):
    expected = generate(target, PROMPT, NEW, eos_token_ids=()).row(0)
    for name, draft in drafts(draft_model).items():
        result = speculative_generate(target, draft, PROMPT, NEW, k=k, eos_token_ids=(), compile=inductor)
        assert result.tokens == expected, (name, k)
        assert result.decode_path == result.verify_path == "compiled" and result.decode_note is None
        assert result.draft_path == ("compiled" if name == "model draft" else None)
        assert result.stats.tokens == NEW and result.stats.rejected > 0     # misses, so rollbacks, were checked


def test_compiled_sampling_gives_the_eager_paths_samples_for_a_seed(target, draft_model, inductor, one_thread):
    sampling = SamplingConfig(temperature=1.0, seed=5)
    for draft in drafts(draft_model).values():
        eager = speculative_generate(target, draft, PROMPT, NEW, k=3, sampling=sampling, eos_token_ids=())
        compiled = speculative_generate(target, draft, PROMPT, NEW, k=3, sampling=sampling, eos_token_ids=(),
                                        compile=inductor)
        assert compiled.tokens == eager.tokens and compiled.decode_path == "compiled"
        assert eager.decode_path == "eager" and eager.draft_path is None and eager.warmup_seconds == 0.0


def test_every_verify_pass_is_one_fixed_shape_step_of_k_plus_1(target, draft_model, monkeypatch, one_thread):
    decoder = CompiledDecoder(backend=CompileCounter())
    widths, original = [], decoder.verify

    def spy(model, cache, tokens, positions, key_mask):
        if model is target:
            widths.append((tokens.shape, positions.shape, key_mask.shape))
        return original(model, cache, tokens, positions, key_mask)
    monkeypatch.setattr(decoder, "verify", spy)
    result = speculative_generate(target, PromptLookupDraft(ngram=2), PROMPT, NEW, k=4, eos_token_ids=(),
                                  compile=decoder)
    assert result.verify_path == "compiled"
    assert len(widths) == 1 + result.stats.target_calls                  # the warm-up, then every pass
    assert {w[:2] for w in widths} == {((1, 5), (1, 5))}                 # padded: one shape for all
    assert len({w[2] for w in widths}) == 1


def test_the_decoder_reused_across_calls_compiles_nothing_more(target, draft_model, one_thread):
    counter = CompileCounter()
    decoder = CompiledDecoder(backend=counter)
    draft = ModelDraft(draft_model)
    first = speculative_generate(target, draft, PROMPT, NEW, k=3, eos_token_ids=(), compile=decoder)
    assert first.compiles == counter.frame_count == 2                    # the verify pass, the draft step
    assert first.warmup_seconds > 0
    for prompt in (PROMPT, PROMPT[:9], PROMPT + [7, 8]):                 # one length bucket
        again = speculative_generate(target, draft, prompt, NEW, k=3, eos_token_ids=(), compile=decoder)
        assert again.compiles == 0 and again.warmup_seconds == 0.0 and again.decode_note is None
    assert counter.frame_count == 2
    lookup = speculative_generate(target, PromptLookupDraft(), PROMPT, NEW, k=3, eos_token_ids=(), compile=decoder)
    assert lookup.compiles == 0 and counter.frame_count == 2             # the target's verify graph again


def test_the_warm_up_stays_out_of_the_timed_seconds(target, one_thread):
    import time

    def slow_backend(graph, example_inputs):
        time.sleep(1.0)
        return graph.forward
    result = speculative_generate(target, PromptLookupDraft(), PROMPT, 6, k=2, eos_token_ids=(),
                                  compile=CompiledDecoder(backend=slow_backend))
    assert result.warmup_seconds >= 1.0 and result.seconds < 0.5 and result.compiles == 1


def test_a_failing_compile_says_eager_in_a_note_and_a_warning(target, draft_model, monkeypatch, one_thread):
    decoder = CompiledDecoder(backend=CompileCounter())

    def no_compiler(device_type):
        raise RuntimeError("Cannot find a working triton installation.\nmore details")
    monkeypatch.setattr(decoder, "_step_fn", no_compiler)
    expected = generate(target, PROMPT, NEW, eos_token_ids=()).row(0)
    with pytest.warns(UserWarning, match=r"^Compiled decoding is not available here \(Cannot find a working triton"):
        result = speculative_generate(target, ModelDraft(draft_model), PROMPT, NEW, k=3, eos_token_ids=(),
                                      compile=decoder)
    assert result.tokens == expected
    assert result.decode_path == result.verify_path == result.draft_path == "eager"
    assert result.decode_note.startswith("Compiled decoding is not available here (Cannot find a working triton")


def test_a_draft_that_cannot_compile_makes_the_whole_path_eager(target, draft_model, monkeypatch, one_thread):
    decoder = CompiledDecoder(backend=CompileCounter())
    original = decoder._step_fn

    def step_fn(device_type):
        compiled = original(device_type)

        def run(model, *args, **kwargs):
            if model is draft_model:
                raise RuntimeError("no kernel for the draft")
            return compiled(model, *args, **kwargs)
        return run
    monkeypatch.setattr(decoder, "_step_fn", step_fn)
    with pytest.warns(UserWarning, match="no kernel for the draft"):
        result = speculative_generate(target, ModelDraft(draft_model), PROMPT, NEW, k=3, eos_token_ids=(),
                                      compile=decoder)
    assert (result.verify_path, result.draft_path, result.decode_path) == ("compiled", "eager", "eager")
    assert "no kernel for the draft" in result.decode_note
    assert result.tokens == generate(target, PROMPT, NEW, eos_token_ids=()).row(0)


def test_padding_past_the_models_context_verifies_eagerly_and_says_so(target, one_thread):
    context = target.config.max_position
    prompt = [(3 * i) % 250 for i in range(context - 8)]
    with pytest.warns(UserWarning, match="past the model's context"):
        result = speculative_generate(target, PromptLookupDraft(), prompt, 8, k=4, eos_token_ids=(),
                                      compile=CompiledDecoder(backend=CompileCounter()))
    assert result.decode_path == "eager" and "past the model's context" in result.decode_note
    assert result.tokens == generate(target, prompt, 8, eos_token_ids=()).row(0)


def test_bad_compile_values_and_caches_are_refused_in_one_sentence(target, draft_model):
    counting = CompiledDecoder(backend=CompileCounter())
    cases = [(dict(compile="yes"), "compile must be True, False, None"),
             (dict(compile=1.5), "compile must be True, False, None"),
             (dict(compile=True, cache=Int8KVCache.for_model(target, 1, 64)), "fixed-shape writes"),
             (dict(compile=counting, cache=StaticKVCache.for_model(target, 1, len(PROMPT) + NEW)),
              "needs 47 positions"),
             (dict(compile=counting, draft=ModelDraft(draft_model, cache_factory=StaticKVCache)), "cache_factory")]
    for kwargs, words in cases:
        draft = kwargs.pop("draft", PromptLookupDraft())
        with pytest.raises(LabError, match=words) as error:
            speculative_generate(target, draft, PROMPT, NEW, k=4, eos_token_ids=(), **kwargs)
        assert "\n" not in str(error.value)


def test_a_cache_passed_in_with_room_for_the_padding_is_used(target, one_thread):
    cache = StaticKVCache.for_model(target, 1, len(PROMPT) + NEW + 3)
    result = speculative_generate(target, PromptLookupDraft(ngram=2), PROMPT, NEW, k=4, eos_token_ids=(),
                                  cache=cache, compile=CompiledDecoder(backend=CompileCounter()))
    assert result.verify_path == "compiled" and cache.length > len(PROMPT)
    assert result.tokens == generate(target, PROMPT, NEW, eos_token_ids=()).row(0)


def test_the_same_draft_runs_eagerly_again_after_a_compiled_call(target, draft_model, one_thread):
    draft = ModelDraft(draft_model)
    decoder = CompiledDecoder(backend=CompileCounter())
    speculative_generate(target, draft, PROMPT, NEW, k=3, eos_token_ids=(), compile=decoder)
    eager = speculative_generate(target, draft, PROMPT, NEW, k=3, eos_token_ids=())
    assert eager.draft_path is None and eager.decode_path == "eager"
    assert draft.cache is not decoder.cache_for(draft_model, 1, len(PROMPT) + NEW, purpose="draft")


def test_on_a_simulated_gpu_the_verify_pass_warms_up_as_a_cuda_graph(target, monkeypatch):
    """Simulated only (no CUDA tensor here): the verify pass's warm-up makes the three calls that
    cudagraph trees need (run, record, replay) and says "compiled + CUDA graphs" when torch
    recorded and skipped nothing, else "compiled" with a warning."""
    from simulated_gpu import GPUS, simulated
    from test_compiled import _CudaCache
    from torch._dynamo.utils import counters

    from labsupport.engine.compiled import CUDA_GRAPHS
    for skips, path in ((0, CUDA_GRAPHS), (1, "compiled")):
        decoder, widths = CompiledDecoder(), []

        def fake_verify(model, cache, tokens, *args):
            widths.append(tokens.shape)
            counters["inductor"]["cudagraph_skips"] += skips
            counters["inductor"]["cudagraph_recorded_non_static_inputs"] += 1 - skips
        monkeypatch.setattr(decoder, "verify", fake_verify)
        cache = _CudaCache(target.config, 1, 64, dtype=target.dtype)
        with simulated(GPUS["H100"]):
            if skips:
                with pytest.warns(UserWarning, match="runs without CUDA graphs here"):
                    report = decoder.warm_up(target, cache, width=5)
            else:
                report = decoder.warm_up(target, cache, width=5)
        assert report.path == path and widths == [(1, 5)] * 3 and cache.length == 0
        assert decoder.warm_up(target, cache, width=5).warmup_seconds == 0.0     # once per (cache, width)
