"""Import Hugging Face weights into labsupport's Transformer.

Introduced in notebook 00 (where the time goes).

Hugging Face stores q, k, v (and gate, up) as separate matrices; our model fuses
them, so the import concatenates along the output dimension. GPT-2 checkpoints
store their linear layers as ``Conv1D`` with the matrix transposed
(in_features, out_features), so those are transposed back.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from .config import ModelConfig, config_from_hf
from .layout import apply_layout
from .transformer import Transformer


def _tied_embedding(hf: dict[str, torch.Tensor], embedding_name: str) -> torch.Tensor:
    """A checkpoint with tied embeddings may store the shared matrix under either name."""
    return hf[embedding_name] if embedding_name in hf else hf["lm_head.weight"]


def _llama_state_dict(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    embedding = _tied_embedding(hf, "model.embed_tokens.weight")
    ours = {"embed.weight": embedding,
            "final_norm.weight": hf["model.norm.weight"]}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        ours[f"blocks.{i}.attn_norm.weight"] = hf[p + "input_layernorm.weight"]
        ours[f"blocks.{i}.mlp_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        ours[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)     # (q + 2 kv, hidden)
        ours[f"blocks.{i}.attn.out.weight"] = hf[p + "self_attn.o_proj.weight"]
        ours[f"blocks.{i}.mlp.gate_up.weight"] = torch.cat(
            [hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]], dim=0)  # (2 inter, hidden)
        ours[f"blocks.{i}.mlp.down.weight"] = hf[p + "mlp.down_proj.weight"]
    ours["lm_head.weight"] = embedding if config.tie_embeddings else hf["lm_head.weight"]
    return ours


def _gpt2_state_dict(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    hf = {k.removeprefix("transformer."): v for k, v in hf.items()}
    embedding = _tied_embedding(hf, "wte.weight")
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
    ours["lm_head.weight"] = embedding if config.tie_embeddings else hf["lm_head.weight"]
    return ours


def model_from_state_dict(config: ModelConfig, hf_state: dict[str, torch.Tensor],
                          device="cpu", dtype=torch.float32) -> Transformer:
    """Build a Transformer from a Hugging Face-format state dict."""
    convert = _llama_state_dict if config.family == "llama" else _gpt2_state_dict
    try:
        ours = convert(config, hf_state)
    except KeyError as missing:
        raise LabError(f"The checkpoint lacks the weight {missing}; it does not look like a "
                       f"{config.family}-family model.") from None
    with torch.device("meta"):
        model = Transformer(config)
    # clone: tensors straight from safetensors are views of a memory-mapped file
    model.load_state_dict({k: v.clone(memory_format=torch.contiguous_format) for k, v in ours.items()},
                          strict=True, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    # The RoPE tables are not part of a checkpoint: compute them for real.
    if config.family == "llama":
        from .transformer import rope_tables
        model.rope_cos, model.rope_sin = rope_tables(config)
    model = model.to(device=device, dtype=dtype).eval()
    apply_layout(model)
    return model


def from_hf(hf_model, name: str = "custom", device=None, dtype=None) -> Transformer:
    """labsupport's Transformer with the weights of a loaded Hugging Face model."""
    config = config_from_hf(hf_model.config, name=name)
    state = hf_model.state_dict()
    weight = next(hf_model.parameters())
    return model_from_state_dict(config, state, device=device or weight.device,
                                 dtype=dtype or weight.dtype)
