"""Hugging Face configs into labsupport's `ModelConfig`: every field that changes the
computation is read or refused in one sentence.

Introduced in notebook 00 (where the time goes). Model import lives here, beside the weights
(`weights.hf_import`), so that `engine/` only runs a model.
"""

from __future__ import annotations

from ..engine.config import FAMILIES, ModelConfig
from ..errors import ModelUnavailable


# What `config_from_hf` does with each field of a Hugging Face config (LlamaConfig,
# GPT2Config, and the PreTrainedConfig fields both inherit; checked against
# transformers 5), so that a checkpoint option the Transformer lacks is refused in one
# sentence instead of loading into wrong logits:
#
# Read (they set the computation):
#   llama  vocab_size, hidden_size, intermediate_size, num_hidden_layers,
#          num_attention_heads, num_key_value_heads (None: as many as the heads), head_dim,
#          max_position_embeddings, rms_norm_eps, the RoPE base (rope_parameters["rope_theta"],
#          or the older top-level rope_theta), attention_bias, mlp_bias, tie_word_embeddings,
#          bos_token_id, eos_token_id
#   gpt2   vocab_size, n_embd, n_layer, n_head, n_inner (None: 4 x n_embd), n_positions,
#          layer_norm_epsilon, tie_word_embeddings, bos_token_id, eos_token_id
# Refused unless at the value the Transformer implements:
#   llama  hidden_act (silu, also called swish); the RoPE type (default only: no linear,
#          dynamic, yarn, longrope or llama3 scaling; rope_scaling is the older name), and
#          RoPE parameters that differ per layer type
#   gpt2   activation_function (the tanh GELU: gelu_new, or its equals gelu_pytorch_tanh,
#          gelu_python_tanh, gelu_fast), scale_attn_weights (true),
#          scale_attn_by_inverse_layer_idx (false), add_cross_attention (false)
#   both   per_layer_config (layers that differ from each other), quantization_config
#          (quantized weights), is_encoder_decoder, and the options of related architectures
#          that a config may carry and that HF's Llama and GPT-2 would silently drop, listed in
#          _RELATED_OPTIONS: sliding windows and non-full layer types, partial RoPE, layers
#          without RoPE, logit and attention softcapping, Granite's multipliers, logit scales,
#          query/key norms, experts, parallel residuals
# Ignored (they do not change inference):
#   initializer_range (initialization only); attention_dropout, resid_pdrop, embd_pdrop,
#   attn_pdrop (dropout is off at inference); summary_* (GPT2DoubleHeadsModel's
#   multiple-choice head); pretraining_tp (transformers 4 split the same matrix multiplies
#   into slices, transformers 5 ignores it); reorder_and_upcast_attn (the same attention in
#   float32 and another order: rounding only, and transformers applies it only in eager mode);
#   pad_token_id (the embedding's padding_idx only matters in training); use_cache;
#   dtype / torch_dtype (the caller picks the dtype); output_hidden_states,
#   output_attentions, return_dict; chunk_size_feed_forward (unused by these models, and
#   chunking gives the same result); id2label, label2id, problem_type (classification
#   heads); architectures, transformers_version, _name_or_path.

LLAMA_ACTIVATIONS = ("silu", "swish")
GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast")


def _absent_or(*neutral):
    return lambda value: value is None or value is False or any(value == n for n in neutral)


# (field, whether its value is one the Transformer computes, what the Transformer does instead)
_RELATED_OPTIONS = (
    ("quantization_config", lambda value: not value, "it loads unquantized float weights"),
    ("is_encoder_decoder", _absent_or(), "it is a decoder only"),
    ("add_cross_attention", _absent_or(), "it has no cross-attention"),
    ("sliding_window", _absent_or(), "it attends to every earlier position"),
    ("use_sliding_window", _absent_or(), "it attends to every earlier position"),
    ("attention_chunk_size", _absent_or(), "it attends to every earlier position"),
    ("layer_types", lambda value: value is None or all(t == "full_attention" for t in value),
     "every layer uses full attention"),
    ("partial_rotary_factor", _absent_or(1, 1.0), "it rotates the whole head"),
    ("rotary_pct", _absent_or(1, 1.0), "it rotates the whole head"),
    ("no_rope_layers", lambda value: value is None or all(value), "every layer uses RoPE"),
    ("attn_logit_softcapping", _absent_or(), "it does not softcap"),
    ("final_logit_softcapping", _absent_or(), "it does not softcap"),
    ("logits_scaling", _absent_or(1, 1.0), "it does not scale the logits"),
    ("logit_scale", _absent_or(1, 1.0), "it does not scale the logits"),
    ("embedding_multiplier", _absent_or(1, 1.0), "it does not scale the embeddings"),
    ("residual_multiplier", _absent_or(1, 1.0), "it does not scale the residual branches"),
    ("attention_multiplier", _absent_or(), "it scales attention by 1/sqrt(head_dim)"),
    ("use_qk_norm", _absent_or(), "it has no query/key norm"),
    ("qk_layernorm", _absent_or(), "it has no query/key norm"),
    ("num_local_experts", _absent_or(0, 1), "it has one dense MLP per layer"),
    ("num_experts", _absent_or(0, 1), "it has one dense MLP per layer"),
    ("use_parallel_residual", _absent_or(), "attention and MLP run one after the other"),
)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(field_name: str, value, instead: str) -> ModelUnavailable:
    """The one-sentence refusal of a config option the Transformer does not implement."""
    return ModelUnavailable(
        f"The checkpoint's config sets {field_name}={_short(value)}, which labsupport's model does not "
        f"implement ({instead}); use a model without that option, or Hugging Face's own model "
        "(labsupport.weights.loading.load_hf_model)."
    )


def _check_related_options(hf_config) -> None:
    if getattr(hf_config, "is_heterogeneous", False):           # first: it guards the other reads
        varying = ", ".join(sorted(getattr(hf_config, "per_layer_attributes", None) or ())) or "some fields"
        raise ModelUnavailable(
            f"The checkpoint's config sets per_layer_config (its layers differ in {varying}), which labsupport's "
            "model does not implement (every layer has the same shape); use a model without that option, or "
            "Hugging Face's own model (labsupport.weights.loading.load_hf_model)."
        )
    for name, implemented, instead in _RELATED_OPTIONS:
        value = getattr(hf_config, name, None)
        try:
            fine = implemented(value)
        except Exception:                # a value of an unexpected type is not one the model computes
            fine = False
        if not fine:
            raise _refuse(name, value, instead)


def _rope_theta(hf_config) -> float:
    """The RoPE base; refuse any RoPE variant other than the original one."""
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        raise _refuse("rope_parameters", rope, "it uses the original RoPE")
    if any(isinstance(v, dict) for v in rope.values()):
        raise _refuse("rope_parameters", rope, "one RoPE for every layer")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ModelUnavailable(f"RoPE scaling {rope_type!r} (rope_type in the checkpoint's config) is not "
                               "implemented in labsupport's model; use a model with default RoPE.")
    partial = rope.get("partial_rotary_factor")
    if partial not in (None, 1, 1.0):
        raise _refuse("partial_rotary_factor", partial, "it rotates the whole head")
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", None))
    return 10000.0 if theta is None else float(theta)


def _eos_ids(hf_config) -> tuple[int, ...]:
    eos = getattr(hf_config, "eos_token_id", None)
    return tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())


def config_from_hf(hf_config, name: str = "custom") -> ModelConfig:
    """Translate a Hugging Face config (LlamaConfig or GPT2Config) into a ModelConfig.

    Every field that changes the computation is either read or refused in one sentence
    (`ModelUnavailable`); the table above this function lists which is which.

    Notebook 00 (where the time goes).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ModelUnavailable(
            f"Model type {model_type!r} is not supported by labsupport's decoder; "
            "use a Llama-style (e.g. SmolLM2) or GPT-2-style model."
        )
    _check_related_options(hf_config)
    if model_type == "llama":
        act = getattr(hf_config, "hidden_act", "silu")
        if act not in LLAMA_ACTIVATIONS:
            raise _refuse("hidden_act", act, "its SwiGLU MLP uses SiLU")
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None)
        derived = hf_config.hidden_size // heads if heads else None
        return ModelConfig(
            family="llama",
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            intermediate_size=hf_config.intermediate_size,
            max_position=hf_config.max_position_embeddings,
            norm_eps=hf_config.rms_norm_eps,
            rope_theta=_rope_theta(hf_config),
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            bos_token_id=getattr(hf_config, "bos_token_id", None),
            eos_token_ids=_eos_ids(hf_config),
            name=name,
            attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            explicit_head_dim=head_dim if head_dim and head_dim != derived else None,
        )
    act = getattr(hf_config, "activation_function", "gelu_new")
    if act not in GPT2_ACTIVATIONS:
        raise _refuse("activation_function", act, "its MLP uses the tanh approximation of GELU, gelu_new")
    if not getattr(hf_config, "scale_attn_weights", True):
        raise _refuse("scale_attn_weights", False, "it scales attention scores by 1/sqrt(head_dim)")
    if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise _refuse("scale_attn_by_inverse_layer_idx", True,
                      "it scales attention scores by 1/sqrt(head_dim) in every layer")
    return ModelConfig(
        family="gpt2",
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.n_embd,
        num_layers=hf_config.n_layer,
        num_heads=hf_config.n_head,
        num_kv_heads=hf_config.n_head,
        intermediate_size=getattr(hf_config, "n_inner", None) or 4 * hf_config.n_embd,
        max_position=hf_config.n_positions,
        norm_eps=hf_config.layer_norm_epsilon,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        bos_token_id=getattr(hf_config, "bos_token_id", None),
        eos_token_ids=_eos_ids(hf_config),
        name=name,
    )
