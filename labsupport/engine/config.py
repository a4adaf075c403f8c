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
from ..inputs import whole_number

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

    # --- what one step costs, from the shapes: the one cost model (as nanochat keeps its FLOP and
    # KV-byte counts beside its model). lab/roofline, lab/long_context_bytes, the caches and the plots
    # call these; the exercises' checkers keep their own reference on purpose. Notebook 00.

    @property
    def kv_values_per_token(self) -> int:
        """Numbers one position of one row adds to the KV cache: 2 (K and V) x layers x kv-heads
        x head_dim. Times the bytes per value (`precision.bytes_per_value`): the cache's bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matrix multiply per token: every layer's attention and
        MLP matrices plus the output projection (norms, biases and lookups cost a few FLOPs per
        value, not 2 per row)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h                          # qkv, out
        mlp = (3 if self.family == "llama" else 2) * h * i            # gate, up, down / fc, proj
        return self.num_layers * (attention + mlp) + v * h           # + lm_head

    @property
    def params_read_per_step(self) -> int:
        """Parameters a decode step reads in full: all but the lookup tables (the token embedding
        unless tied to the output layer, GPT-2's learned positions). Matches `Transformer.weight_bytes`."""
        params = self.num_parameters
        if not self.tie_embeddings:
            params -= self.vocab_size * self.hidden_size               # the embedding: a lookup
        if self.family == "gpt2":
            params -= self.max_position * self.hidden_size             # learned positions: a lookup
        return params

    def attention_flops(self, rows: int, context: int) -> int:
        """FLOPs of one new token per row attending to `context` positions: q.k scores and the
        weighted sum of values, 2 x head_dim each, per query head and layer."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * context * rows

    def decode_flops(self, rows: int, context: int) -> int:
        """FLOPs of one decode step: 2 per matmul weight per row, plus attention over the cache."""
        return 2 * self.matmul_params * rows + self.attention_flops(rows, context)

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
