"""labsupport's decoder gives the same logits as Hugging Face's model on the same weights."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from labsupport.errors import LabError, ModelUnavailable
from labsupport.engine.config import PRESETS, ModelConfig
from labsupport.weights.loading import load_model
from labsupport.weights.fixtures import random_model
from labsupport.weights.hf_import import from_hf

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def tiny_hf_llama(tie=True):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=tie, rope_theta=10000.0)
    return LlamaForCausalLM(cfg).eval()


def tiny_hf_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=300, n_embd=64, n_layer=3, n_head=4, n_positions=128)
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("make_hf", [tiny_hf_llama, lambda: tiny_hf_llama(tie=False), tiny_hf_gpt2],
                         ids=["llama", "llama-untied", "gpt2"])
def test_logits_match_hugging_face_on_tiny_models(make_hf):
    hf = make_hf()
    ours = from_hf(hf)
    tokens = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours.logits(ours(tokens))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_loads_a_local_hugging_face_directory(tmp_path):
    hf = tiny_hf_llama()
    hf.save_pretrained(tmp_path)
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")))
    tok.save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path), device="cpu")
    tokens = torch.tensor([[1, 5, 9, 200]])
    with torch.no_grad():
        torch.testing.assert_close(model.logits(model(tokens)), hf(tokens).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_embedded_model_matches_hugging_face(smollm, smollm_hf):
    model, tok = smollm
    tokens = torch.tensor([tok.encode("The capital of France is Paris, and the capital of Italy is")])
    with torch.no_grad():
        torch.testing.assert_close(model.logits(model(tokens)), smollm_hf(tokens).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_embedded_model_has_the_published_shape(smollm):
    model, tok = smollm
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.num_parameters == 134_515_008
    assert (model.config.num_layers, model.config.hidden_size, model.config.num_heads,
            model.config.num_kv_heads, model.config.vocab_size) == (30, 576, 9, 3, 49152)
    assert model.weight_bytes() == 4 * (134_515_008 - 0) - 0  # tied: embedding read once, as lm_head
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_tiny_presets_are_seeded(name):
    a, b, c = random_model(name, seed=0), random_model(name, seed=0), random_model(name, seed=1)
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(a(tokens), b(tokens))
        assert not torch.equal(a(tokens), c(tokens))


def test_parameter_count_formula_matches_the_modules(tiny_model):
    name = tiny_model.config.name
    assert sum(p.numel() for p in tiny_model.parameters()) == PRESETS[name].num_parameters
    # GPT-2 small: the handbook chapter's 474.7 MB in float32 is 124,439,808 parameters x 4 bytes
    assert PRESETS["gpt2"].num_parameters == 124_439_808


def test_config_validation_speaks_plainly():
    with pytest.raises(LabError, match="multiple of num_kv_heads"):
        ModelConfig(family="llama", vocab_size=10, hidden_size=64, num_layers=1, num_heads=4,
                    num_kv_heads=3, intermediate_size=8, max_position=8)
    with pytest.raises(LabError, match="Unknown model family"):
        ModelConfig(family="bert", vocab_size=10, hidden_size=64, num_layers=1, num_heads=4,
                    num_kv_heads=4, intermediate_size=8, max_position=8)


def test_unknown_model_name_is_one_sentence():
    with pytest.raises(ModelUnavailable) as err:
        load_model("no-such-model", device="cpu")
    message = str(err.value)
    assert "Unknown model name" in message and "smollm2-135m" in message and "\n" not in message


def test_unreachable_hub_fails_fast_with_one_sentence(monkeypatch, tmp_path):
    import time
    from labsupport.weights import loading
    monkeypatch.setenv("HF_HOME", str(tmp_path))           # an empty local cache
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(ModelUnavailable, match="hub cannot be reached"):
        load_model("gpt2", device="cpu")
    assert time.perf_counter() - start < 5


def test_hub_probe_honours_offline_mode(monkeypatch):
    from labsupport.weights import loading
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert loading._hub_reachable() is False


def test_the_course_model_is_the_embedded_one_unless_the_setting_names_another(monkeypatch):
    from labsupport.errors import ModelUnavailable
    from labsupport.weights.loading import EMBEDDED, MODEL_SETTING, course_model_name
    monkeypatch.delenv(MODEL_SETTING, raising=False)
    assert course_model_name() == EMBEDDED
    monkeypatch.setenv(MODEL_SETTING, "smollm2-1.7b")
    assert course_model_name() == "smollm2-1.7b"
    monkeypatch.setenv(MODEL_SETTING, "HuggingFaceTB/SmolLM2-360M-Instruct")
    assert course_model_name() == "HuggingFaceTB/SmolLM2-360M-Instruct"
    monkeypatch.setenv(MODEL_SETTING, "smollm-huge")
    with pytest.raises(ModelUnavailable, match="LABSUPPORT_MODEL='smollm-huge' names no model"):
        course_model_name()


def test_model_config_reads_a_shape_without_loading_weights():
    from labsupport.errors import ModelUnavailable
    from labsupport.engine.config import PRESETS
    from labsupport.weights.loading import model_config
    assert model_config("smollm2-135m") is PRESETS["smollm2-135m"]
    with pytest.raises(ModelUnavailable, match="Unknown model name"):
        model_config("no-such-model")


@pytest.mark.parametrize("name", ["smollm2-135m", "gpt2", "tiny-llama", "tiny-gpt2"])
def test_the_cost_model_beside_the_model_counts_what_the_model_holds_and_reads(name):
    """Issue 39: one cost model (ModelConfig's counts); checked here against a model built from the
    config: its matrices, the bytes a decode step reads, and what a KV cache of it allocates."""
    import math

    import torch

    from labsupport.engine.kv_cache import StaticKVCache, kv_cache_bytes
    from labsupport.engine.models.transformer import Transformer
    config = PRESETS[name]
    with torch.device("meta"):
        model = Transformer(config)
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))   # lm_head too
    assert config.matmul_params == matrices
    assert config.params_read_per_step * 4 == model.weight_bytes()
    assert config.decode_flops(3, 10) == 2 * matrices * 3 + 4 * config.num_layers * config.num_heads * config.head_dim * 30
    if max(config.num_layers, config.hidden_size) <= 64:
        cache = StaticKVCache.for_model(Transformer(config), 2, 5)
        assert cache.nbytes == kv_cache_bytes(config, 5, 2) == config.kv_values_per_token * 5 * 2 * 4
    assert math.isclose(kv_cache_bytes(config, 7, 1, torch.bfloat16), config.kv_values_per_token * 7 * 2)
