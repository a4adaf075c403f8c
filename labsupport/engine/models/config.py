"""Model configuration: one plain dataclass for both model families.

Introduced in notebook 00 (where the time goes), where it is used to count the
FLOPs and bytes of one decode step.

The course uses two families of decoder-only transformers:

* ``"llama"``: rotary position embeddings (RoPE), RMSNorm, a SwiGLU MLP and
  grouped-query attention (fewer key/value heads than query heads). The embedded
  default model, SmolLM2-135M-Instruct, is one.
* ``"gpt2"``: learned position embeddings, LayerNorm, a GELU MLP and full
  multi-head attention, with biases everywhere. The handbook chapter's models
  (gpt2, distilgpt2) are of this family.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ...errors import LabError, ModelUnavailable
from ...inputs import whole_number

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer; validated on construction.
    Notebook 00 (where the time goes)."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = "custom"
    # Llama family only (GPT-2 always has biases and hidden_size / num_heads per head):
    attention_bias: bool = False             # biases on the q, k, v and output projections
    mlp_bias: bool = False                   # biases on the gate, up and down projections
    explicit_head_dim: int | None = None     # a head size other than hidden_size / num_heads
    # Sliding-window attention (notebook 08, long context): None = every earlier key; W = each
    # query sees at most the last W keys, on every path that attends (`masks.py` applies it).
    attention_window: int | None = None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise LabError(f"Unknown model family {self.family!r}; use one of {FAMILIES}.")
        for attr in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "intermediate_size", "max_position"):
            if getattr(self, attr) < 1:
                raise LabError(f"ModelConfig.{attr} must be a positive integer, got {getattr(self, attr)}.")
        if self.explicit_head_dim is None and self.hidden_size % self.num_heads:
            raise LabError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}).")
        if self.explicit_head_dim is not None and (self.explicit_head_dim < 2 or self.explicit_head_dim % 2):
            raise LabError(f"ModelConfig.explicit_head_dim must be a positive even integer (RoPE rotates pairs), "
                           f"got {self.explicit_head_dim}.")
        if self.num_heads % self.num_kv_heads:
            raise LabError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}).")
        if self.family == "gpt2" and self.num_kv_heads != self.num_heads:
            raise LabError("GPT-2-style models use full multi-head attention: set num_kv_heads = num_heads.")
        if self.family == "gpt2" and (self.attention_bias or self.mlp_bias or self.explicit_head_dim is not None):
            raise LabError("attention_bias, mlp_bias and explicit_head_dim are Llama-family options (GPT-2 always "
                           "has biases and hidden_size / num_heads per head): leave them at their defaults.")
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        if self.attention_window is not None:           # NumPy and torch integers too, as an int
            object.__setattr__(self, "attention_window", whole_number(
                self.attention_window, "attention_window (the keys each query sees, or None for all)"))

    @property
    def head_dim(self) -> int:
        """Size of one attention head: hidden_size / num_heads unless the checkpoint says otherwise."""
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        """Parameters counted from the shapes (tied embeddings counted once)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.family == "llama":
            attention = h * q + 2 * h * kv + q * h          # q, k, v, o
            attention += (q + 2 * kv + h) if self.attention_bias else 0
            mlp = 3 * h * i                                  # gate, up, down
            mlp += (2 * i + h) if self.mlp_bias else 0
            norms = 2 * h
            embeddings = v * h
            final = h
        else:
            attention = 4 * h * h + 4 * h                    # qkv + out, with biases
            mlp = 2 * h * i + i + h                          # fc + proj, with biases
            norms = 4 * h                                    # two LayerNorms (weight + bias)
            embeddings = v * h + self.max_position * h       # tokens + learned positions
            final = 2 * h
        head = 0 if self.tie_embeddings else v * h
        return self.num_layers * (attention + mlp + norms) + embeddings + final + head

    def with_(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


# Named presets. The tiny ones have random weights (seeded) and are for tests.
PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
        num_kv_heads=3, intermediate_size=1536, max_position=8192, norm_eps=1e-5,
        rope_theta=100000.0, tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
        name="smollm2-135m",
    ),
    "gpt2": ModelConfig(
        family="gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
        num_kv_heads=12, intermediate_size=3072, max_position=1024, norm_eps=1e-5,
        tie_embeddings=True, bos_token_id=50256, eos_token_ids=(50256,), name="gpt2",
    ),
    "tiny-llama": ModelConfig(
        family="llama", vocab_size=260, hidden_size=64, num_layers=2, num_heads=4,
        num_kv_heads=2, intermediate_size=128, max_position=256, norm_eps=1e-5,
        rope_theta=10000.0, tie_embeddings=True, bos_token_id=256, eos_token_ids=(257,),
        name="tiny-llama",
    ),
    "tiny-gpt2": ModelConfig(
        family="gpt2", vocab_size=260, hidden_size=64, num_layers=2, num_heads=4,
        num_kv_heads=4, intermediate_size=256, max_position=256, norm_eps=1e-5,
        tie_embeddings=True, bos_token_id=256, eos_token_ids=(257,), name="tiny-gpt2",
    ),
    # SmolLM2-1.7B's shapes (HuggingFaceTB/SmolLM2-1.7B-Instruct's config.json), for random weights
    # where the hub cannot be reached: large enough on a datacenter GPU to be memory-bound at
    # batch 1 instead of launch-bound (the GPU check, the GPU presets).
    "smollm2-1.7b-shape": ModelConfig(
        family="llama", vocab_size=49152, hidden_size=2048, num_layers=24, num_heads=32,
        num_kv_heads=32, intermediate_size=8192, max_position=8192, norm_eps=1e-5,
        rope_theta=130000.0, tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
        name="smollm2-1.7b-shape",
    ),
    # A 7B-class Llama config (Llama-2-7B's shapes), for memory arithmetic only.
    "llama-7b-shape": ModelConfig(
        family="llama", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=32, intermediate_size=11008, max_position=4096, norm_eps=1e-5,
        tie_embeddings=False, name="llama-7b-shape",
    ),
}


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
