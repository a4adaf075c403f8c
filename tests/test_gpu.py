"""GPU checks: the same code on CUDA, device and dtype from the data. Skipped without a GPU."""

import pytest
import torch

from labsupport.engine.generation import generate
from labsupport.weights.loading import load_model
from labsupport.weights.fixtures import random_model

pytestmark = [pytest.mark.gpu, pytest.mark.platform]
PROMPT = [5, 17, 42, 99, 3, 250, 7]


def test_tiny_model_gives_the_same_tokens_on_cuda():
    cpu = random_model("tiny-llama", seed=3)
    gpu = random_model("tiny-llama", seed=3, device="cuda")
    assert generate(gpu, PROMPT, 20, eos_token_ids=()).row(0) == generate(cpu, PROMPT, 20, eos_token_ids=()).row(0)


def test_static_cache_lives_on_the_device():
    from labsupport.engine.kv_cache import StaticKVCache
    model = random_model("tiny-llama", device="cuda")
    cache = StaticKVCache(model.config, 2, 16, device=model.device, dtype=model.dtype)
    assert cache.keys.is_cuda


def test_cuda_graph_decoding_gives_the_same_tokens():
    model = random_model("tiny-llama", seed=3, device="cuda")
    plain = generate(model, PROMPT, 24, eos_token_ids=())
    assert generate(model, PROMPT, 24, eos_token_ids=(), compile=True).row(0) == plain.row(0)


def test_cuda_graphs_are_recorded_replayed_and_reported():
    """The compiled step is captured (the cache is a static input: no "mutated inputs" skip), one
    graph per bucket, the warm-up apart from the decode time, and compile=None picks it on CUDA."""
    from labsupport.engine.compiled import CompiledDecoder
    from labsupport.weights.fixtures import lively_model
    model = lively_model("tiny-llama", seed=3).to("cuda")
    decoder = CompiledDecoder()
    for prompts in (PROMPT, [PROMPT, [9, 8, 7]], [PROMPT, [9, 8, 7], [4, 4]]):     # rows buckets 1, 2, 4
        plain = generate(model, prompts, 40, eos_token_ids=(), compile=False)
        first = generate(model, prompts, 40, eos_token_ids=(), compile=decoder)
        assert first.tokens.tolist() == plain.tokens.tolist()
        assert first.decode_path == "compiled + CUDA graphs", first.decode_note
        assert first.cudagraph_skips == 0 and first.compiles == 1 and first.warmup_seconds > 0
        again = generate(model, prompts, 40, eos_token_ids=(), compile=decoder)
        assert again.tokens.tolist() == plain.tokens.tolist() and again.compiles == 0
        assert again.warmup_seconds == 0.0 and again.decode_path == "compiled + CUDA graphs"
    assert generate(model, PROMPT, 40, eos_token_ids=(), compile=None).decode_path == "compiled + CUDA graphs"
    assert generate(model, PROMPT, 40, eos_token_ids=()).decode_path == "eager"          # the default: like for like


def test_embedded_model_matches_hugging_face_on_cuda(smollm_hf):
    model, tok = load_model("smollm2-135m", device="cuda", dtype=torch.float32)
    hf = smollm_hf.to("cuda")
    tokens = torch.tensor([tok.encode("The capital of France is")], device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(model.logits(model(tokens)), hf(tokens).logits, atol=1e-3, rtol=1e-3)
    smollm_hf.to("cpu")


def test_bf16_generation_runs_on_cuda_where_supported():
    from labsupport.engine.hardware import bf16_supported
    if not bf16_supported(torch.device("cuda")):
        pytest.skip("this GPU has no bf16")
    model, tok = load_model("smollm2-135m", device="cuda", dtype=torch.bfloat16)
    result = generate(model, tok.encode("Hello"), 16)
    assert result.tokens.shape[1] >= 1


def test_serving_engine_on_cuda_gives_each_request_its_tokens_alone():
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_workload import make_workload
    model = random_model("tiny-llama", seed=3, device="cuda", dtype=torch.float64)
    prompts = [[5, 17, 42], [99, 3, 250, 7, 8], [1, 2]]
    requests = make_workload(prompts, count=9, median_new_tokens=8, max_new_tokens=20, seed=1)
    for policy in ("static", "continuous"):
        engine = Engine(model, max_slots=4, policy=policy, block_size=4, cache_tokens=64)
        result = engine.run(requests)
        assert engine.cache.keys.is_cuda
        assert list(result.tokens().values()) == [
            generate(model, r.prompt, r.max_new_tokens, eos_token_ids=()).row(0) for r in requests]
        engine.blocks.assert_no_leaks()


def test_stack_ladder_runs_on_cuda():
    from labsupport.lab.serving_workload import make_workload
    from labsupport.lab.stack import run_stack
    model = random_model("tiny-llama", seed=3, device="cuda")
    requests = make_workload([[5, 17, 42, 99], [3, 250, 7]], count=4, median_new_tokens=6, max_new_tokens=10)
    result = run_stack(model, requests, slots=2)
    assert all(r["tokens_per_s"] > 0 for r in result["stages"])
