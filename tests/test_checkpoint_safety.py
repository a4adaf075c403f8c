"""Never silently wrong: a checkpoint loads into the logits Hugging Face computes, or is
refused in one sentence that names the config field or the tensor at fault.

Each case saves a tiny random Hugging Face model to a directory (config.json +
safetensors, as from the hub), changes it where the case says, and loads it with
`load_model`, the path every notebook uses.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

from labsupport.errors import ModelUnavailable
from labsupport.weights.hf_config import config_from_hf
from labsupport.weights.loading import load_model
from labsupport.weights.fixtures import random_model
from labsupport.weights.hf_import import from_hf

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

TOKENS = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(1))


def hf_llama(**options):
    settings = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)
    settings.update(options)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    with torch.no_grad():                       # biases start at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    return model


def hf_gpt2(**options):
    settings = dict(vocab_size=300, n_embd=64, n_layer=3, n_head=4, n_positions=128)
    settings.update(options)
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**settings)).eval()


def save(hf, path, config=None, state=None):
    """save_pretrained plus a tokenizer; then optionally edit config.json and the weights."""
    from tokenizers import Tokenizer, models
    hf.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
                            ).save_pretrained(path)
    if config:
        data = json.loads((path / "config.json").read_text())
        config(data)
        (path / "config.json").write_text(json.dumps(data))
    if state:
        weights = path / "model.safetensors"
        save_file(state(load_file(str(weights))), str(weights), metadata={"format": "pt"})
    return path


def refused(path, *fragments):
    """load_model refuses `path` in one sentence that contains every fragment."""
    with pytest.raises(ModelUnavailable) as info:
        load_model(str(path), device="cpu")
    message = str(info.value)
    assert "\n" not in message and message.endswith("."), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def assert_matches_hf(path):
    ours, _ = load_model(str(path), device="cpu", dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(ours(TOKENS)), theirs(TOKENS).logits, atol=1e-5, rtol=1e-5)
    return ours


# --- options the Transformer implements: same logits as Hugging Face ----------------------------

IMPLEMENTED = {
    "llama attention_bias": lambda: hf_llama(attention_bias=True),
    "llama mlp_bias": lambda: hf_llama(mlp_bias=True),
    "llama both biases, untied": lambda: hf_llama(attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    "llama head_dim above hidden/heads": lambda: hf_llama(head_dim=32),
    "llama head_dim below, with biases": lambda: hf_llama(head_dim=8, num_key_value_heads=4, attention_bias=True),
    "llama head_dim equal to hidden/heads": lambda: hf_llama(head_dim=16),
    "llama hidden_act swish": lambda: hf_llama(hidden_act="swish"),
    "llama pretraining_tp 2": lambda: hf_llama(pretraining_tp=2),
    "llama attention_dropout": lambda: hf_llama(attention_dropout=0.5),
    "llama rope_theta and eps": lambda: hf_llama(rope_theta=500000.0, rms_norm_eps=1e-2),
    "gpt2 gelu_pytorch_tanh": lambda: hf_gpt2(activation_function="gelu_pytorch_tanh"),
    "gpt2 gelu_fast": lambda: hf_gpt2(activation_function="gelu_fast"),
    "gpt2 reorder_and_upcast_attn": lambda: hf_gpt2(reorder_and_upcast_attn=True),
    "gpt2 n_inner and eps, untied": lambda: hf_gpt2(n_inner=100, layer_norm_epsilon=1e-2, tie_word_embeddings=False),
}


@pytest.mark.parametrize("case", IMPLEMENTED)
def test_implemented_options_match_hugging_face(case, tmp_path):
    hf = IMPLEMENTED[case]()
    ours = assert_matches_hf(save(hf, tmp_path))
    # the parameter count formula knows the biases and the head size too
    assert sum(p.numel() for p in ours.parameters()) == ours.config.num_parameters
    assert ours.config.num_parameters == sum(p.numel() for p in hf.parameters())


def test_biases_and_head_dim_also_come_through_from_hf(tmp_path):
    hf = hf_llama(attention_bias=True, mlp_bias=True, head_dim=24, num_key_value_heads=4)
    ours = from_hf(hf)
    assert ours.config.explicit_head_dim == 24 and ours.config.attention_bias and ours.config.mlp_bias
    with torch.no_grad():
        torch.testing.assert_close(ours.logits(ours(TOKENS)), hf(TOKENS).logits, atol=1e-5, rtol=1e-5)


def test_the_kv_cache_path_works_with_biases_and_a_wide_head():
    """Prefill then decode with a cache equals one pass over the whole sequence."""
    from labsupport.engine.kv_cache import StaticKVCache
    ours = from_hf(hf_llama(attention_bias=True, mlp_bias=True, head_dim=32))
    cache = StaticKVCache(ours.config, batch_size=2, max_len=32)
    with torch.no_grad():
        full = ours.logits(ours(TOKENS))
        prefix = ours.logits(ours(TOKENS[:, :-1], cache=cache))
        last = ours.logits(ours(TOKENS[:, -1:], cache=cache))
    torch.testing.assert_close(torch.cat([prefix, last], dim=1), full, atol=1e-5, rtol=1e-5)


def test_the_older_top_level_rope_theta_is_read(tmp_path):
    def older(data):
        data.pop("rope_parameters", None)
        data["rope_theta"] = 500000.0
    path = save(hf_llama(rope_theta=500000.0), tmp_path, config=older)
    assert assert_matches_hf(path).config.rope_theta == 500000.0


def test_an_explicit_head_dim_equal_to_the_derived_one_changes_nothing():
    config = config_from_hf(hf_llama(head_dim=16).config)
    assert config.explicit_head_dim is None and config.head_dim == 16


# --- options it does not implement: one sentence naming the field and its value -----------------

def _set(**fields):
    return lambda data: data.update(fields)


REFUSED = {
    # name: (make the HF model, edit of config.json or None, what the message names)
    "llama hidden_act gelu": (lambda: hf_llama(hidden_act="gelu"), None, "hidden_act='gelu'"),
    "llama hidden_act relu": (lambda: hf_llama(hidden_act="relu"), None, "hidden_act='relu'"),
    "llama linear RoPE scaling": (lambda: hf_llama(rope_scaling={"rope_type": "linear", "factor": 2.0}), None,
                                  "'linear'"),
    "llama legacy rope_scaling": (hf_llama, lambda d: (d.pop("rope_parameters", None),
                                                      d.update(rope_scaling={"type": "dynamic", "factor": 2.0})),
                                  "'dynamic'"),
    "llama llama3 RoPE": (lambda: hf_llama(rope_parameters={"rope_type": "llama3", "factor": 8.0,
                                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 64,
                                                            "rope_theta": 10000.0}), None, "'llama3'"),
    "llama partial_rotary_factor": (hf_llama, _set(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    "llama sliding_window": (hf_llama, _set(sliding_window=8), "sliding_window=8"),
    "llama use_sliding_window": (hf_llama, _set(use_sliding_window=True), "use_sliding_window=True"),
    "llama layer_types": (hf_llama, _set(layer_types=["full_attention", "sliding_attention", "full_attention"]),
                          "layer_types="),
    "llama softcapping": (hf_llama, _set(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
    "llama attn softcapping": (hf_llama, _set(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    "llama granite multiplier": (hf_llama, _set(residual_multiplier=0.22), "residual_multiplier=0.22"),
    "llama logits scaling": (hf_llama, _set(logits_scaling=8.0), "logits_scaling=8.0"),
    "llama qk norm": (hf_llama, _set(use_qk_norm=True), "use_qk_norm=True"),
    "llama experts": (hf_llama, _set(num_local_experts=8), "num_local_experts=8"),
    "llama no_rope_layers": (hf_llama, _set(no_rope_layers=[1, 0, 1]), "no_rope_layers=[1, 0, 1]"),
    "llama quantized": (hf_llama, _set(quantization_config={"quant_method": "gptq", "bits": 4}),
                        "quantization_config="),
    "llama per-layer config": (hf_llama, _set(per_layer_config={"1": {"intermediate_size": 48}}),
                               "per_layer_config", ),
    "llama encoder-decoder": (hf_llama, _set(is_encoder_decoder=True), "is_encoder_decoder=True"),
    "gpt2 activation gelu": (lambda: hf_gpt2(activation_function="gelu"), None, "activation_function='gelu'"),
    "gpt2 activation relu": (lambda: hf_gpt2(activation_function="relu"), None, "activation_function='relu'"),
    "gpt2 activation quick_gelu": (lambda: hf_gpt2(activation_function="quick_gelu"), None,
                                   "activation_function='quick_gelu'"),
    "gpt2 scale_attn_weights": (lambda: hf_gpt2(scale_attn_weights=False), None, "scale_attn_weights=False"),
    "gpt2 scale_attn_by_inverse_layer_idx": (lambda: hf_gpt2(scale_attn_by_inverse_layer_idx=True), None,
                                             "scale_attn_by_inverse_layer_idx=True"),
    "gpt2 add_cross_attention": (lambda: hf_gpt2(add_cross_attention=True), None, "add_cross_attention=True"),
    "gpt2 sliding_window": (hf_gpt2, _set(sliding_window=8), "sliding_window=8"),
    "mistral model type": (hf_llama, _set(model_type="mistral"), "'mistral'"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_options_it_does_not_implement_are_refused_in_one_sentence(case, tmp_path):
    make, edit, names = REFUSED[case]
    message = refused(save(make(), tmp_path, config=edit), names)
    assert "; use a" in message                         # says what to do


def test_the_same_refusals_hold_for_an_in_memory_model():
    with pytest.raises(ModelUnavailable, match="scale_attn_weights=False"):
        from_hf(hf_gpt2(scale_attn_weights=False))
    with pytest.raises(ModelUnavailable, match="hidden_act='gelu'"):
        from_hf(hf_llama(hidden_act="gelu"))


def test_a_config_transformers_cannot_read_is_one_sentence(tmp_path):
    path = save(hf_llama(), tmp_path)
    (path / "config.json").write_text("{not json")
    refused(path, "Could not read the model config")


# --- the checkpoint's tensors: unused, missing, misshapen, quantized ------------------------------

def test_a_tensor_the_model_does_not_use_is_named(tmp_path):
    extra = lambda s: {**s, "model.layers.3.mlp.up_proj.weight": torch.zeros(96, 64)}   # noqa: E731
    refused(save(hf_llama(), tmp_path, state=extra), "'model.layers.3.mlp.up_proj.weight'", "does not use")


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tmp_path):
    refused(save(hf_llama(), tmp_path, config=_set(num_hidden_layers=2)), "'model.layers.2.", "and 8 more")


def test_biases_the_config_does_not_announce_are_refused(tmp_path):
    """attention_bias dropped from config.json: its biases would be ignored, so refuse."""
    refused(save(hf_llama(attention_bias=True), tmp_path, config=_set(attention_bias=False)),
            "self_attn.", "_proj.bias'", "does not use")


def test_a_missing_tensor_is_named(tmp_path):
    drop = lambda s: {k: v for k, v in s.items() if k != "model.layers.1.self_attn.k_proj.weight"}  # noqa: E731
    refused(save(hf_llama(), tmp_path, state=drop), "lacks the tensor 'model.layers.1.self_attn.k_proj.weight'")


def test_an_untied_model_without_its_output_projection_is_refused(tmp_path):
    drop = lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"}   # noqa: E731
    refused(save(hf_llama(tie_word_embeddings=False), tmp_path, state=drop), "'lm_head.weight'")


@pytest.mark.parametrize("edit, tensor, got, wanted", [
    (_set(vocab_size=301), "model.embed_tokens.weight", "(300, 64)", "(301, 64)"),
    (_set(num_key_value_heads=None), "model.layers.0.self_attn.k_proj.weight", "(32, 64)", "(64, 64)"),
    (_set(head_dim=32), "model.layers.0.self_attn.q_proj.weight", "(64, 64)", "(128, 64)"),
    (_set(intermediate_size=97), "model.layers.0.mlp.gate_proj.weight", "(96, 64)", "(97, 64)"),
])
def test_a_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path, edit, tensor, got, wanted):
    refused(save(hf_llama(), tmp_path, config=edit), repr(tensor), got, wanted)


def test_a_gpt2_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    refused(save(hf_gpt2(), tmp_path, config=_set(n_positions=256)), "'wpe.weight'", "(128, 64)", "(256, 64)")


def test_a_quantized_tensor_is_refused(tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    to_int8 = lambda s: {**s, name: s[name].to(torch.int8)}   # noqa: E731
    refused(save(hf_llama(), tmp_path, state=to_int8), repr(name), "torch.int8")


def test_a_tied_config_with_a_different_output_projection_is_refused(tmp_path):
    head = lambda s: {**s, "lm_head.weight": torch.randn(300, 64)}   # noqa: E731
    refused(save(hf_llama(), tmp_path, state=head), "tie_word_embeddings", "lm_head.weight")


@pytest.mark.parametrize("edit", [
    lambda s: {**s, "lm_head.weight": s["model.embed_tokens.weight"].clone()},       # both names, equal
    lambda s: {**{k: v for k, v in s.items() if k != "model.embed_tokens.weight"},     # the head's name only
               "lm_head.weight": s["model.embed_tokens.weight"]},
    lambda s: {**s, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)},   # an old RoPE buffer
], ids=["both names", "head name only", "old inv_freq buffer"])
def test_tied_checkpoints_and_old_buffers_still_load(tmp_path, edit):
    assert_matches_hf(save(hf_llama(), tmp_path, state=edit))


def test_old_gpt2_checkpoints_with_mask_buffers_and_no_prefix_load(tmp_path):
    def old_style(state):
        state = {k.removeprefix("transformer."): v for k, v in state.items()}
        for i in range(3):
            state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128)).bool()
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        return state
    assert_matches_hf(save(hf_gpt2(), tmp_path, state=old_style))


def test_a_gpt2_tensor_stored_with_and_without_prefix_is_refused(tmp_path):
    dup = lambda s: {**s, "ln_f.weight": torch.zeros(64)}   # noqa: E731
    refused(save(hf_gpt2(), tmp_path, state=dup), "'ln_f.weight'", "twice")


# --- which files are the weights ----------------------------------------------------------------

def test_a_stray_safetensors_file_beside_the_model_is_not_merged(tmp_path):
    path = save(hf_llama(), tmp_path)
    save_file({"model.layers.0.mlp.down_proj.weight": torch.randn(64, 96) * 10}, str(path / "stray.safetensors"))
    assert_matches_hf(path)


def test_a_sharded_checkpoint_loads_the_shards_its_index_lists(tmp_path):
    hf = hf_llama()
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    save(hf_llama(), tmp_path / "unused")                          # a tokenizer, for load_model
    for f in (tmp_path / "unused").glob("tokenizer*"):
        f.rename(tmp_path / f.name)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    save_file({"model.norm.weight": torch.zeros(64)}, str(tmp_path / "stray.safetensors"))
    assert_matches_hf(tmp_path)


def _sharded(path):
    hf_llama().save_pretrained(path, max_shard_size="20KB")
    return sorted(path.glob("model-*.safetensors"))


def test_shards_without_an_index_are_refused(tmp_path):
    _sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    refused(tmp_path, "neither model.safetensors nor model.safetensors.index.json")


def test_a_shard_the_index_lists_but_is_missing_is_named(tmp_path):
    shards = _sharded(tmp_path)
    shards[1].unlink()
    refused(tmp_path, repr(shards[1].name), "is not in")


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    shards = _sharded(tmp_path)
    save_file({**load_file(str(shards[0])), "model.norm.weight": torch.full((64,), 7.0)}, str(shards[0]))
    refused(tmp_path, "'model.norm.weight'", "stored both in")


@pytest.mark.parametrize("index", ["[1, 2", '{"weight_map": ["a"]}', '{"weight_map": {"x": "../elsewhere.safetensors"}}',
                                   '{"no": "weight_map"}'])
def test_a_damaged_shard_index_is_one_sentence(tmp_path, index):
    _sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    refused(tmp_path, "shard index", "is damaged")


def test_a_damaged_weights_file_is_one_sentence(tmp_path):
    path = save(hf_llama(), tmp_path)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    refused(path, "Could not read the weights file", "download or save the model again")


def test_a_directory_with_a_peft_adapter_is_refused(tmp_path):
    path = save(hf_llama(), tmp_path)
    (path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    refused(path, "adapter_config.json", "merge")


def test_a_directory_without_config_is_one_sentence(tmp_path):
    path = save(hf_llama(), tmp_path)
    (path / "config.json").unlink()
    refused(path, "has no config.json")


def test_presets_are_untouched():
    """The tiny presets have no biases and the derived head size, as before."""
    model = random_model("tiny-llama")
    assert model.blocks[0].attn.qkv.bias is None and model.blocks[0].mlp.gate_up.bias is None
    assert model.config.head_dim == 16
