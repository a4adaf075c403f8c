"""A compact decoder-only transformer for the two families the course uses.

Introduced in notebook 00 (where the time goes); the cache argument is the
subject of notebook 01 (KV cache).

Read it top to bottom: embeddings, then `num_layers` pre-norm blocks
(attention, then MLP, each added back to the residual stream), then a final
norm; that is `Transformer.forward`, the one entrance, which returns hidden
states. `Transformer.logits` is the output projection to vocabulary logits, for
the positions asked for only. The two families differ only in a few places,
each marked with ``if self.family == ...``:

=============  ==========================  ==========================
               llama (SmolLM2)             gpt2 (gpt2, distilgpt2)
=============  ==========================  ==========================
positions      rotary (RoPE) on q and k    learned embedding added to x
norm           RMSNorm                     LayerNorm
MLP            SwiGLU: down(silu(g) * u)   GELU: proj(gelu(fc(x)))
attention      grouped-query (kv < heads)  multi-head, with biases
=============  ==========================  ==========================

Some Llama-family checkpoints add biases to the attention projections
(``attention_bias``) or to the MLP (``mlp_bias``), or choose a head size other
than hidden_size / num_heads (``explicit_head_dim``): the config carries those.

Every matrix multiply is an ``nn.Linear``, so precision changes and
quantization (notebooks 03 and 04) are a swap of those modules. The query, key
and value projections are fused into one Linear (``qkv``), and so are the
gate and up projections (``gate_up``): one bigger matmul instead of three or
two small ones saves per-call overhead in the memory-bound decode step. On a CPU
the norms (with the residual add before the second one), the rotation of the queries and
keys and SwiGLU's silu(gate) * up are one call each as well (fused.py: C++ kernels doing the
same arithmetic); the plain torch code below stays the reference, and the path everywhere else.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import LabError
from ..kv_cache import KVCache
from . import fused
from ..config import ModelConfig
from .masks import causal_mask


class RMSNorm(nn.Module):
    """Root-mean-square norm (Llama). Computed in float32, as the reference does.
    Notebook 00 (where the time goes)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.active(x) and self.weight.dtype == x.dtype:
            return torch.ops.labsupport.rms_norm(x.contiguous(), self.weight, self.eps)   # one call
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm): the residual add and the norm after it, in one call on a CPU."""
        if fused.active(x) and self.weight.dtype == x.dtype == delta.dtype:
            return torch.ops.labsupport.add_rms_norm(x.contiguous(), delta.contiguous(), self.weight, self.eps)
        x = x + delta
        return x, self(x)


class LayerNorm(nn.LayerNorm):
    """GPT-2's norm (torch's own), with RMSNorm's `add_and_norm`. Notebook 00."""

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + delta
        return x, self(x)


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, each (max_position, head_dim).
    Notebook 00 (where the time goes)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.max_position, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)                  # (max_position, head_dim)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (first-half, second-half) pair of x by its position's angle.

    x: (batch, T, heads, head_dim); cos, sin: (batch, T, 1, head_dim).

    Notebook 00 (where the time goes).
    """
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos + rotated_half * sin


def rotate_queries_and_keys(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """RoPE on the first `heads` heads of qkv (the queries, then the keys); the values pass.

    qkv: (batch, T, heads + kv_heads, head_dim); cos, sin: (batch, T, head_dim). One call on a
    CPU (fused.py), else `apply_rope` and a concatenation. Notebook 00 (where the time goes).
    """
    if fused.active(qkv) and cos.dtype == qkv.dtype:
        return fused.rope(qkv, cos, sin, heads)                      # any strides
    rotated = apply_rope(qkv[:, :, :heads], cos.unsqueeze(2), sin.unsqueeze(2))   # (B, T, heads, D)
    return torch.cat([rotated, qkv[:, :, heads:]], dim=2)


class Attention(nn.Module):
    """Causal self-attention with an optional KV cache and grouped-query heads.
    Notebook 00 (where the time goes)."""

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        bias = config.family == "gpt2" or config.attention_bias
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.qkv = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=bias)
        self.out = nn.Linear(q_size, config.hidden_size, bias=bias)

    def forward(self, x, rope, cache, mask):
        batch, T, _ = x.shape
        qkv = self.qkv(x).view(batch, T, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        if rope is not None:       # (B, T, heads + 2 kv_heads, D): queries and keys are the first heads
            qkv = rotate_queries_and_keys(qkv, *rope, self.num_heads + self.num_kv_heads)
        qkv = qkv.transpose(1, 2)                                   # (B, heads + 2 kv_heads, T, D)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if cache is not None:
            k, v = cache.update(self.layer_index, k, v)                         # (B, kv_heads, S, D)
        # F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
        # is_causal=False, scale=None, enable_gqa=False): a boolean attn_mask is True where a query
        # may attend, broadcast to (B, heads, T, S); is_causal aligns the triangle to the upper left,
        # so it is passed only for a fresh prompt (S == T, masks.causal_mask); both together are an
        # error. enable_gqa lets kv_heads < heads share keys without copying them. Which kernel
        # runs (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, the can_use_* filters, as of
        # torch 2.11-2.13): flash takes GQA but no attn_mask (check_for_attn_mask) and only fp16/bf16
        # on compute capability 8.0+; memory-efficient takes masks and fp32 but no GQA (its
        # check_batch_size_and_num_heads_dense is instantiated without GQA support; torch's main
        # branch adds it); cuDNN takes GQA and masks (check_attn_mask_shape) but only fp16/bf16 on
        # 8.0+, and runs only where torch's priority order (priority_order) tries it before math;
        # math takes everything, exact but materialising the (T, S) scores. So on a GPU an fp32 GQA
        # model always runs math; fp16/bf16 prompts without padding get flash (or cuDNN); a padded
        # batch, a window or a fixed-shape decode mask gets cuDNN where it is tried, else math. On a CPU (sdp_utils_cpp.cpp) the fused kernel takes GQA,
        # masks, fp32 and bf16 (torch._fused_sdp_choice answers FLASH_ATTENTION for all four on
        # 2.13). No path repeats the key/value heads by hand: pyproject asks for torch >= 2.11, which (like every
        # torch since 2.5) has enable_gqa.
        # The mask is a tensor or the string "causal"; `mask == "causal"` on a tensor is a tensor
        # comparison that torch < 2.13's Dynamo cannot trace ("torch.* op returned non-Tensor"),
        # so the type is asked first and the comparison is a plain Python one.
        causal = isinstance(mask, str) and mask == "causal"
        y = F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=None if causal else mask,
            is_causal=causal,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )                                                                        # (B, heads, T, D)
        y = y.transpose(1, 2).reshape(batch, T, self.num_heads * self.head_dim)  # (B, T, heads*D)
        return self.out(y)


class SwiGLU(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), with gate and up fused.
    Notebook 00 (where the time goes)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x):
        gate_up = self.gate_up(x)                                   # (..., 2 * intermediate)
        if fused.active(gate_up):
            return self.down(torch.ops.labsupport.silu_mul(gate_up))    # one call on a CPU (fused.py)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class GeluMLP(nn.Module):
    """GPT-2's MLP: proj(gelu(fc(x))), with the tanh approximation GPT-2 was trained with.
    Notebook 00 (where the time goes)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, config.intermediate_size)
        self.proj = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """One pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)).
    Notebook 00 (where the time goes)."""

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        if config.family == "llama":
            self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
            self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
            self.mlp = SwiGLU(config)
        else:
            self.attn_norm = LayerNorm(config.hidden_size, eps=config.norm_eps)
            self.mlp_norm = LayerNorm(config.hidden_size, eps=config.norm_eps)
            self.mlp = GeluMLP(config)
        self.attn = Attention(config, layer_index)

    def forward(self, x, rope, cache, mask):
        fast = fused.decode_block(self, x, rope, cache, mask)     # a CPU decode step: one C++ call
        if fast is not None:
            return fast
        x, normed = self.mlp_norm.add_and_norm(x, self.attn(self.attn_norm(x), rope, cache, mask))
        return x + self.mlp(normed)


def _checked_state(config: ModelConfig, expected: dict, state) -> dict:
    """`state` once every tensor `expected` names is there, float, finite and of its shape, and
    nothing else is (else one sentence naming the first problem); lm_head.weight filled in when tied."""
    if not isinstance(state, Mapping):
        raise LabError(f"The state must be a dict from weight names to tensors (like model.state_dict()), "
                       f"got {type(state).__name__}.")
    state, fits = dict(state), f"a {config.family} model with this config"
    if config.tie_embeddings and "lm_head.weight" not in state and "embed.weight" in state:
        state["lm_head.weight"] = state["embed.weight"]          # the same matrix, by either name
    extra, missing = [n for n in state if n not in expected], [n for n in expected if n not in state]
    if extra:
        raise LabError(f"The state dict holds {extra[0]!r}{_and_more(extra)}, which {fits} does not have; "
                       f"check that the config belongs to these weights.")
    if missing:
        raise LabError(f"The state dict lacks {missing[0]!r} of shape {tuple(expected[missing[0]].shape)}"
                       f"{_and_more(missing)}, which {fits} needs; give every weight.")
    for name, like in expected.items():
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise LabError(f"The state dict's {name!r} is {kind}, not a floating-point tensor; "
                           f"give unquantized float weights.")
        if tensor.shape != like.shape:
            raise LabError(f"The state dict's {name!r} has shape {tuple(tensor.shape)} where {fits} needs "
                           f"{tuple(like.shape)}; check that the config belongs to these weights.")
        # a sum is finite unless a value is not (or it overflows: then each value is checked)
        if not torch.isfinite(tensor.sum()) and not torch.isfinite(tensor).all():
            raise LabError(f"The state dict's {name!r} holds NaN or infinite values; these weights are "
                           f"damaged: load them again.")
    head, embed = state["lm_head.weight"], state["embed.weight"]
    same = head.data_ptr() == embed.data_ptr() and head.stride() == embed.stride() and head.dtype == embed.dtype
    if config.tie_embeddings and not (same or torch.equal(head, embed.to(head.dtype))):
        raise LabError("The config ties lm_head to the embedding, yet the state dict's 'lm_head.weight' "
                       "differs from 'embed.weight'; leave it out, or untie the config.")
    return state


def _and_more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


class Transformer(nn.Module):
    """The course's decoder. One entrance: `forward` runs tokens (batch, T) through every
    layer and returns hidden states (batch, T, hidden); `logits` projects the positions asked
    for onto the vocabulary. Notebook 00 (where the time goes)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.family = config.family
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        if self.family == "gpt2":
            self.position_embed = nn.Embedding(config.max_position, config.hidden_size)
        else:
            cos, sin = rope_tables(config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        if self.family == "llama":
            self.final_norm = RMSNorm(config.hidden_size, config.norm_eps)
        else:
            self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @classmethod
    def from_state_dict(cls, config: ModelConfig, state: dict, device="cpu", dtype=torch.float32) -> "Transformer":
        """The model holding `state` (in this class's own names: `weights.hf_import` translates a
        checkpoint's), with no random initialization first. A state that does not fit the config
        (a missing or extra name, a wrong shape, non-float or non-finite values) is refused in one
        sentence naming the first such tensor. With tied embeddings, lm_head.weight may be left out
        (it is the embedding). Notebook 00 (where the time goes)."""
        if not isinstance(config, ModelConfig) or not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise LabError(f"from_state_dict takes a ModelConfig and a floating-point torch dtype (such as "
                           f"torch.float32), got {type(config).__name__} and {dtype!r}.")
        with torch.device("meta"):
            model = cls(config)
        state = _checked_state(config, model.state_dict(), state)
        # clone: tensors straight from safetensors are views of a memory-mapped file
        model.load_state_dict({k: v.clone(memory_format=torch.contiguous_format) for k, v in state.items()},
                              strict=True, assign=True)
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        if config.family == "llama":                 # not part of a checkpoint: computed for real
            model.rope_cos, model.rope_sin = rope_tables(config)
        return model.to(device=device, dtype=dtype).eval()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                mask: torch.Tensor | str | None = None) -> torch.Tensor:
        """Run `tokens` (batch, T) through every layer; returns the final-normed hidden states
        (batch, T, hidden): `logits` turns the positions you need into logits.

        cache: a `KVCache` (kv_cache.py): the pass reserves the T positions after what it holds
            (`cache.reserve(T)`, which moves its length on: the only place a length moves), and
            attends to everything cached; or a `KVWriter` a caller has placed itself (the serving
            engine's paged view, a fixed-shape writer), with `positions` and `mask` given; or None.
        positions: (batch, T) each token's position; default start, start + 1, ..., where start
            is what the cache held. Left-padded rows pass their own.
        mask: which keys each query sees (build it with masks.py, with the model's
            `config.attention_window`); default: causal after what the cache holds, windowed.
        """
        batch, T = tokens.shape
        start, writer = 0, cache
        if isinstance(cache, KVCache):
            start = cache.length
            writer = cache.reserve(T)                       # positions [start, start + T) are this pass's
        if positions is None:
            positions = torch.arange(start, start + T, device=tokens.device).expand(batch, T)
        if mask is None:
            mask = causal_mask(T, start, None, tokens.device, window=self.config.attention_window)
        return self._layers(tokens, positions, writer, mask)

    def logits(self, hidden: torch.Tensor, at: int | torch.Tensor | None = None) -> torch.Tensor:
        """Project hidden states (batch, T, hidden) onto the vocabulary, only where asked:
        at=None: every position, (batch, T, vocab); an int (-1: the last): (batch, vocab);
        a 1-D tensor of positions (N,): (batch, N, vocab). Sampling needs one position per row,
        and the 49 152-word projection is the model's biggest matmul. Notebook 00."""
        if at is None:
            return self.lm_head(hidden)
        if isinstance(at, int):                 # one position per row, copied out of the strided rows
            return self.lm_head(hidden[:, at].contiguous())                     # (batch, vocab)
        return self.lm_head(hidden.index_select(1, at))                         # (batch, N, vocab)

    def with_attention_window(self, window) -> "Transformer":
        """The same model (the same weights and modules, not a copy) with sliding-window
        attention: each query sees at most the last `window` keys (None: all of them), on every
        path that attends (generate, compiled or not, speculative decoding, the serving engine).
        Introduced in notebook 08 (long context)."""
        windowed = copy.copy(self)                          # shares every parameter, buffer and module
        windowed.config = self.config.with_(attention_window=window)      # validated there
        return windowed

    def _layers(self, tokens, positions, writer, mask) -> torch.Tensor:
        """Embeddings, every block and the final norm: (batch, T, hidden). See `forward`."""
        x = self.embed(tokens)                                          # (B, T, hidden)
        rope = None
        if self.family == "gpt2":
            x = x + self.position_embed(positions)
        else:
            rope = (self.rope_cos[positions], self.rope_sin[positions])     # each (B, T, head_dim)
        for block in self.blocks:
            x = block(x, rope, writer, mask)
        return self.final_norm(x)

    def weight_bytes(self) -> int:
        """Bytes of weights read by one decode step: every parameter and buffer
        (quantized layers keep their packed weights in buffers), each counted once.

        Lookup tables are read one row per token, so they are left out: the RoPE
        tables, learned positions, and the token embedding unless it is tied to
        the output projection (then it is read in full, as lm_head).
        """
        seen, total = set(), 0
        tensors = list(self.named_parameters(remove_duplicate=False)) + list(self.named_buffers())
        for name, tensor in tensors:
            if id(tensor) in seen or name.startswith(("rope_", "position_embed", "embed.")):
                continue
            seen.add(id(tensor))
            total += tensor.nbytes
        return total
