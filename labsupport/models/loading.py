"""Load a model and its tokenizer by name.

Introduced in notebook 00 (where the time goes).

Names:
  "smollm2-135m"               the embedded default (works offline; see embedded.py)
  "tiny-llama", "tiny-gpt2"    random-weight presets for tests (seeded, instant)
  "gpt2", "distilgpt2",
  "smollm2-360m", "smollm2-1.7b", or any "owner/name" on the Hugging Face hub,
  or a local Hugging Face model directory.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from ..errors import ModelUnavailable
from ..hardware import check_dtype, pick_device
from .config import PRESETS, config_from_hf
from .embedded import embedded_model_dir
from .layout import apply_layout
from .transformer import Transformer
from .weights import model_from_state_dict

EMBEDDED = "smollm2-135m"
TINY = ("tiny-llama", "tiny-gpt2")
HUB_ALIASES = {
    "gpt2": "openai-community/gpt2",
    "distilgpt2": "distilbert/distilgpt2",
    "smollm2-135m-hub": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
}
KNOWN_NAMES = (EMBEDDED, *TINY, *HUB_ALIASES)


class ByteTokenizer:
    """A tokenizer for the tiny presets: one token per UTF-8 byte, plus specials.

    It offers the part of the Hugging Face tokenizer interface labsupport uses.
    """

    bos_token_id, eos_token_id, pad_token_id = 256, 257, 257
    chat_template = None
    vocab_size = 260

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size


def random_model(name: str, seed: int = 0, device="cpu", dtype=torch.float32) -> Transformer:
    """A tiny preset with seeded random weights (std 0.02, norms at 1)."""
    generator = torch.Generator().manual_seed(seed)
    model = Transformer(PRESETS[name])
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0) if pname.endswith("weight") else p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    model = model.to(device=device, dtype=dtype).eval()
    apply_layout(model)
    return model


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connection to the hub; never a minute of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_hf_source(name: str) -> str:
    """The directory or hub repository a name refers to, checking availability first."""
    if name == EMBEDDED:
        return str(embedded_model_dir())
    if Path(name).is_dir():
        return name
    repo = HUB_ALIASES.get(name, name)
    if "/" not in repo:
        raise ModelUnavailable(f"Unknown model name {name!r}; use one of {', '.join(KNOWN_NAMES)}, "
                               "a hub name like 'owner/model', or a local model directory.")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(repo, local_files_only=True)
    except Exception:
        pass
    if not _hub_reachable():
        raise ModelUnavailable(f"Model {name!r} is not in the local Hugging Face cache and the hub cannot be "
                               f"reached from here; use the embedded {EMBEDDED!r} or connect to the internet.")
    return repo


def load_tokenizer(name: str):
    """The tokenizer that goes with a model name."""
    if name in TINY:
        return ByteTokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(resolve_hf_source(name))


def load_model(name: str = EMBEDDED, device=None, dtype=torch.float32, seed: int = 0):
    """labsupport's Transformer and its tokenizer: ``model, tokenizer = load_model("smollm2-135m")``.

    device: "cpu", "cuda", ... (default: the best available); dtype: a torch dtype,
    or "auto" for the fastest the device really supports (see hardware.pick_dtype).
    """
    device = pick_device(device)
    if dtype == "auto":
        from ..hardware import pick_dtype
        dtype = pick_dtype(device)
    check_dtype(device, dtype)
    if name in TINY:
        return random_model(name, seed=seed, device=device, dtype=dtype), ByteTokenizer()

    source = resolve_hf_source(name)
    from transformers import AutoConfig, AutoTokenizer
    hf_config = AutoConfig.from_pretrained(source)
    config = config_from_hf(hf_config, name=name)
    state = _read_state_dict(source)
    model = model_from_state_dict(config, state, device=device, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(source)


def _read_state_dict(source: str) -> dict[str, torch.Tensor]:
    """All safetensors shards of a model directory or hub repository, in one dict."""
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file

    directory = Path(source) if Path(source).is_dir() else Path(
        snapshot_download(source, allow_patterns=["*.safetensors", "*.json", "*.txt", "*.model"]))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelUnavailable(f"No safetensors weights in {directory}; labsupport loads safetensors checkpoints only.")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_hf_model(name: str = EMBEDDED, device=None, dtype=torch.float32):
    """The Hugging Face model of the same weights: the peer every benchmark compares against."""
    from transformers import AutoModelForCausalLM
    device = pick_device(device)
    check_dtype(device, dtype)
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_source(name), dtype=dtype)
    return model.to(device).eval()
