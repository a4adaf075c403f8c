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

from ..errors import LabError

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer; validated on construction."""

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

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise LabError(f"Unknown model family {self.family!r}; use one of {FAMILIES}.")
        for attr in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "num_kv_heads", "intermediate_size", "max_position"):
            if getattr(self, attr) < 1:
                raise LabError(f"ModelConfig.{attr} must be a positive integer, got {getattr(self, attr)}.")
        if self.hidden_size % self.num_heads:
            raise LabError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}).")
        if self.num_heads % self.num_kv_heads:
            raise LabError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}).")
        if self.family == "gpt2" and self.num_kv_heads != self.num_heads:
            raise LabError("GPT-2-style models use full multi-head attention: set num_kv_heads = num_heads.")
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        """Parameters counted from the shapes (tied embeddings counted once)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = self.num_kv_heads * self.head_dim
        if self.family == "llama":
            attention = h * h + 2 * h * kv + h * h          # q, k, v, o (no biases)
            mlp = 3 * h * i                                  # gate, up, down
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
    # A 7B-class Llama config (Llama-2-7B's shapes), for memory arithmetic only.
    "llama-7b-shape": ModelConfig(
        family="llama", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=32, intermediate_size=11008, max_position=4096, norm_eps=1e-5,
        tie_embeddings=False, name="llama-7b-shape",
    ),
}


def config_from_hf(hf_config, name: str = "custom") -> ModelConfig:
    """Translate a Hugging Face config (LlamaConfig or GPT2Config) into a ModelConfig."""
    model_type = getattr(hf_config, "model_type", None)
    eos = hf_config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if model_type == "llama":
        rope = getattr(hf_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        if rope.get("rope_type", "default") not in ("default", None):
            raise LabError(f"RoPE scaling {rope.get('rope_type')!r} is not implemented in labsupport's model; use a model with default RoPE.")
        return ModelConfig(
            family="llama",
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
            intermediate_size=hf_config.intermediate_size,
            max_position=hf_config.max_position_embeddings,
            norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(theta),
            tie_embeddings=bool(hf_config.tie_word_embeddings),
            bos_token_id=hf_config.bos_token_id,
            eos_token_ids=eos_ids,
            name=name,
        )
    if model_type == "gpt2":
        return ModelConfig(
            family="gpt2",
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.n_embd,
            num_layers=hf_config.n_layer,
            num_heads=hf_config.n_head,
            num_kv_heads=hf_config.n_head,
            intermediate_size=hf_config.n_inner or 4 * hf_config.n_embd,
            max_position=hf_config.n_positions,
            norm_eps=hf_config.layer_norm_epsilon,
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            bos_token_id=hf_config.bos_token_id,
            eos_token_ids=eos_ids,
            name=name,
        )
    raise LabError(
        f"Model type {model_type!r} is not supported by labsupport's decoder; "
        "use a Llama-style (e.g. SmolLM2) or GPT-2-style model."
    )
