"""Import Hugging Face weights into labsupport's Transformer.

Introduced in notebook 00 (where the time goes). Model import lives in `weights/`, beside the
config translation (`weights.hf_config`), so that `engine/` only runs a model.

Hugging Face stores q, k, v (and gate, up) as separate matrices; our model fuses
them, so the import concatenates along the output dimension. GPT-2 checkpoints
store their linear layers as ``Conv1D`` with the matrix transposed
(in_features, out_features), so those are transposed back.

Before anything is converted, the checkpoint is compared with the tensors the
config calls for (their names and shapes): a tensor the model would not use, a
tensor it needs that is missing, a shape that does not fit, or a non-float
(quantized) tensor is refused in one sentence that names it. The only tensors
left unused on purpose are buffers that older transformers versions saved and
that the model recomputes: Llama's RoPE ``inv_freq`` and GPT-2's causal-mask
``attn.bias`` / ``attn.masked_bias``.
"""

from __future__ import annotations

import re

import torch

from ..engine.config import ModelConfig
from ..engine.models.layout import apply_layout
from ..engine.models.transformer import Transformer
from ..errors import LabError, ModelUnavailable
from .hf_config import config_from_hf

LLAMA_EMBEDDING, GPT2_EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "wte.weight", "lm_head.weight"

# Buffers older checkpoints carry and the model recomputes (transformers itself skips them).
RECOMPUTED = {
    "llama": re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),
    "gpt2": re.compile(r"h\.\d+\.attn\.(bias|masked_bias)"),
}


def expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of this config holds, with its shape
    (GPT-2 names without their optional ``transformer.`` prefix). The output
    projection ``lm_head.weight`` is listed only when it is not tied. Notebook 00 (where the time goes)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if config.family == "llama":
        shapes[LLAMA_EMBEDDING] = (v, h)
        shapes["model.norm.weight"] = (h,)
        for n in range(config.num_layers):
            p = f"model.layers.{n}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            for proj, rows in (("q", q), ("k", kv), ("v", kv), ("o", h)):
                shapes[p + f"self_attn.{proj}_proj.weight"] = (rows, q if proj == "o" else h)
                if config.attention_bias:
                    shapes[p + f"self_attn.{proj}_proj.bias"] = (rows,)
            for proj, rows, cols in (("gate", i, h), ("up", i, h), ("down", h, i)):
                shapes[p + f"mlp.{proj}_proj.weight"] = (rows, cols)
                if config.mlp_bias:
                    shapes[p + f"mlp.{proj}_proj.bias"] = (rows,)
    else:
        shapes[GPT2_EMBEDDING] = (v, h)
        shapes["wpe.weight"] = (config.max_position, h)
        shapes["ln_f.weight"] = shapes["ln_f.bias"] = (h,)
        for n in range(config.num_layers):
            p = f"h.{n}."
            for norm in ("ln_1", "ln_2"):
                shapes[p + f"{norm}.weight"] = shapes[p + f"{norm}.bias"] = (h,)
            # Conv1D stores (in_features, out_features)
            for conv, fan_in, fan_out in (("attn.c_attn", h, 3 * h), ("attn.c_proj", h, h),
                                          ("mlp.c_fc", h, i), ("mlp.c_proj", i, h)):
                shapes[p + f"{conv}.weight"] = (fan_in, fan_out)
                shapes[p + f"{conv}.bias"] = (fan_out,)
    if not config.tie_embeddings:
        shapes[LM_HEAD] = (v, h)
    return shapes


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _and_more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def _checked_checkpoint(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, by the names `expected_hf_shapes` uses, once every one of
    them is known, present, float and of the right shape (else one sentence that names it)."""
    family = config.family
    if family == "gpt2":
        stripped: dict[str, torch.Tensor] = {}
        for name, tensor in hf.items():
            short = name.removeprefix("transformer.")
            if short in stripped:
                raise ModelUnavailable(f"The checkpoint stores the tensor {short!r} twice, with and without the "
                                       "'transformer.' prefix, so which one is meant is unclear; keep one of them.")
            stripped[short] = tensor
        hf = stripped
    expected = expected_hf_shapes(config)
    embedding = LLAMA_EMBEDDING if family == "llama" else GPT2_EMBEDDING
    hf = dict(hf)
    if config.tie_embeddings and LM_HEAD in hf:
        # a tied checkpoint stores the shared matrix under either name, or under both if they are equal
        head = hf.pop(LM_HEAD)
        if embedding not in hf:
            hf[embedding] = head
        elif head.shape != hf[embedding].shape or not torch.equal(head.to(hf[embedding].dtype), hf[embedding]):
            raise ModelUnavailable(
                f"The checkpoint's config ties the output projection to the embedding (tie_word_embeddings=true), "
                f"yet the checkpoint stores an lm_head.weight that differs from {embedding}; set "
                "tie_word_embeddings to false in config.json if that lm_head is meant, or remove it."
            )
    unused = sorted(n for n in hf if n not in expected and not RECOMPUTED[family].fullmatch(n))
    if unused:
        raise ModelUnavailable(
            f"The checkpoint holds the tensor {unused[0]!r}{_and_more(unused)}, which labsupport's {family} model "
            "with this config does not use, so loading it would leave part of the model out; use a checkpoint "
            "whose config.json matches its weights."
        )
    missing = [n for n in expected if n not in hf]
    if missing:
        raise ModelUnavailable(
            f"The checkpoint lacks the tensor {missing[0]!r}{_and_more(missing)}, which a {family}-family model "
            "with this config needs; check that config.json belongs to these weights."
        )
    for name, shape in expected.items():
        tensor = hf[name]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ModelUnavailable(
                f"The checkpoint tensor {name!r} is {kind}, not floating point: it looks quantized, and "
                "labsupport loads unquantized float checkpoints only; use the unquantized model."
            )
        if tuple(tensor.shape) != shape:
            raise ModelUnavailable(
                f"The checkpoint tensor {name!r} has shape {_shape(tensor.shape)} where this config needs "
                f"{_shape(shape)}; check that config.json (vocab_size, hidden_size, heads, head_dim, layers) "
                "belongs to these weights."
            )
    return {name: hf[name] for name in expected}


def _fused(hf: dict[str, torch.Tensor], prefix: str, parts, suffix: str) -> torch.Tensor:
    return torch.cat([hf[f"{prefix}{part}_proj.{suffix}"] for part in parts], dim=0)


def _llama_state_dict(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    embedding = hf[LLAMA_EMBEDDING]
    ours = {"embed.weight": embedding,
            "final_norm.weight": hf["model.norm.weight"]}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        ours[f"blocks.{i}.attn_norm.weight"] = hf[p + "input_layernorm.weight"]
        ours[f"blocks.{i}.mlp_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        parts = ["weight"] + (["bias"] if config.attention_bias else [])
        for part in parts:
            ours[f"blocks.{i}.attn.qkv.{part}"] = _fused(hf, p + "self_attn.", "qkv", part)  # (q + 2 kv, ...)
            ours[f"blocks.{i}.attn.out.{part}"] = hf[p + f"self_attn.o_proj.{part}"]
        parts = ["weight"] + (["bias"] if config.mlp_bias else [])
        for part in parts:
            ours[f"blocks.{i}.mlp.gate_up.{part}"] = _fused(hf, p + "mlp.", ("gate", "up"), part)  # (2 inter, ...)
            ours[f"blocks.{i}.mlp.down.{part}"] = hf[p + f"mlp.down_proj.{part}"]
    ours["lm_head.weight"] = embedding if config.tie_embeddings else hf[LM_HEAD]
    return ours


def _gpt2_state_dict(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    embedding = hf[GPT2_EMBEDDING]
    ours = {"embed.weight": embedding, "position_embed.weight": hf["wpe.weight"],
            "final_norm.weight": hf["ln_f.weight"], "final_norm.bias": hf["ln_f.bias"]}
    renames = {"ln_1": "attn_norm", "ln_2": "mlp_norm"}
    conv1d = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out",
              "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    for i in range(config.num_layers):
        for theirs, mine in renames.items():
            for part in ("weight", "bias"):
                ours[f"blocks.{i}.{mine}.{part}"] = hf[f"h.{i}.{theirs}.{part}"]
        for theirs, mine in conv1d.items():
            ours[f"blocks.{i}.{mine}.weight"] = hf[f"h.{i}.{theirs}.weight"].t()   # (out, in)
            ours[f"blocks.{i}.{mine}.bias"] = hf[f"h.{i}.{theirs}.bias"]
    ours["lm_head.weight"] = embedding if config.tie_embeddings else hf[LM_HEAD]
    return ours


def model_from_state_dict(config: ModelConfig, hf_state: dict[str, torch.Tensor],
                          device="cpu", dtype=torch.float32) -> Transformer:
    """Build a Transformer from a Hugging Face-format state dict (checked first: see the module doc).
    Notebook 00 (where the time goes)."""
    hf = _checked_checkpoint(config, hf_state)
    convert = _llama_state_dict if config.family == "llama" else _gpt2_state_dict
    try:
        ours = convert(config, hf)
    except KeyError as missing:                 # cannot happen after the check; kept as a plain sentence
        raise LabError(f"The checkpoint lacks the weight {missing}; it does not look like a "
                       f"{config.family}-family model.") from None
    model = Transformer.from_state_dict(config, ours, device=device, dtype=dtype)
    apply_layout(model)
    return model


def from_hf(hf_model, name: str = "custom", device=None, dtype=None) -> Transformer:
    """labsupport's Transformer with the weights of a loaded Hugging Face model.
    Notebook 00 (where the time goes)."""
    config = config_from_hf(hf_model.config, name=name)
    state = hf_model.state_dict()
    weight = next(hf_model.parameters())
    return model_from_state_dict(config, state, device=device or weight.device,
                                 dtype=dtype or weight.dtype)
