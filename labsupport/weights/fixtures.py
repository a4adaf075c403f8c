"""Tiny random-weight models and a byte tokenizer: instant, offline fixtures for the
tests and the exercises' checkers.

Introduced in notebook 00 (where the time goes), where `load_model("tiny-llama")` appears.
"""

from __future__ import annotations


import torch

from ..engine.config import PRESETS, ModelConfig
from ..engine.models.layout import apply_layout
from ..engine.models.transformer import Transformer


TINY = ("tiny-llama", "tiny-gpt2")


class ByteTokenizer:
    """A tokenizer for the tiny presets: one token per UTF-8 byte, plus specials.

    It offers the part of the Hugging Face tokenizer interface labsupport uses.

    Notebook 00 (where the time goes).
    """

    bos_token_id, eos_token_id, pad_token_id = 256, 257, 257
    bos_token, eos_token, pad_token = "<s>", "</s>", "</s>"         # their text (decode leaves them out)
    chat_template = None
    vocab_size = 260

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size


def random_model(name: str | ModelConfig, seed: int = 0, device="cpu", dtype=torch.float32,
                 layout: bool = True) -> Transformer:
    """A tiny preset (or any `ModelConfig`) with seeded random weights (std 0.02, norms at 1).
    Notebook 06 (continuous batching); the unit tests use it throughout, notebook 08 (long
    context) for shapes it only times. layout=False skips timing the weight layouts."""
    generator = torch.Generator().manual_seed(seed)
    model = Transformer(name if isinstance(name, ModelConfig) else PRESETS[name])
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0) if pname.endswith("weight") else p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    model = model.to(device=device, dtype=dtype).eval()
    if layout:
        apply_layout(model)
    return model


def lively_model(name: str = "tiny-llama", seed: int = 0, scale: float = 15.0, noise: float = 0.0,
                 noise_seed: int = 1) -> Transformer:
    """A tiny random preset whose predictions vary from token to token: a target or draft for tests.

    Introduced in notebook 05 (speculative decoding). The plain presets (`random_model`,
    std 0.02) repeat one token forever; here every weight but the norms is scaled by
    `scale`, and `noise` adds a seeded perturbation (that fraction of each weight's
    std) to make a draft that agrees with the target only partly.
    """
    model = random_model(name, seed=seed)
    generator = torch.Generator().manual_seed(noise_seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" not in pname:
                p.mul_(scale)
                if noise:
                    p.add_(torch.randn(p.shape, generator=generator) * noise * p.std())
    return model
