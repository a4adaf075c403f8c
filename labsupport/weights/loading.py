"""Load a model and its tokenizer by name.

Introduced in notebook 00 (where the time goes).

Names:
  "smollm2-135m"               the embedded default (works offline; see embedded.py)
  "tiny-llama", "tiny-gpt2"    random-weight presets for tests (seeded, instant)
  "gpt2", "distilgpt2",
  "smollm2-360m", "smollm2-1.7b", or any "owner/name" on the Hugging Face hub,
  or a local Hugging Face model directory.

A directory's weights are model.safetensors, else the shards its
model.safetensors.index.json lists (as transformers chooses them); any other
*.safetensors file there is not read. Its config is checked field by field
(hf_config.config_from_hf) and its tensors name by name and shape by shape
(weights.model_from_state_dict): what labsupport's Transformer does not
implement is refused in one sentence, never loaded into wrong logits.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch

from ..errors import ModelUnavailable, first_line
from ..engine.hardware import require_usable_dtype, pick_device
from ..engine.config import PRESETS
from .hf_config import config_from_hf
from .embedded import embedded_model_dir
from .fixtures import TINY, ByteTokenizer, random_model
from .hf_import import model_from_state_dict

EMBEDDED = "smollm2-135m"
HUB_ALIASES = {
    "gpt2": "openai-community/gpt2",
    "distilgpt2": "distilbert/distilgpt2",
    "smollm2-135m-hub": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
}
KNOWN_NAMES = (EMBEDDED, *TINY, *HUB_ALIASES)



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
    """The directory or hub repository a name refers to, checking availability first.
    Notebook 00 (where the time goes)."""
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


MODEL_SETTING = "LABSUPPORT_MODEL"
LARGER_MODELS = ("smollm2-360m", "smollm2-1.7b")     # the same family, from the hub: memory-bound on a GPU


def course_model_name() -> str:
    """The model every notebook loads: the embedded SmolLM2-135M, unless the one setting
    LABSUPPORT_MODEL names another (``%env LABSUPPORT_MODEL=smollm2-1.7b`` in a notebook's
    first cell, or in the shell before ``make lab``).

    Introduced in notebook 00 (where the time goes). On a GPU the 135M model is
    launch-bound (kernels finish faster than Python can start them), so its batching curve
    is flat for a reason other than bandwidth; SmolLM2-360M and -1.7B (3.4 GB in fp16, which
    fits a T4) show memory-bound behaviour there. They come from the Hugging Face hub, so
    they need a connection or a cached copy; offline the embedded model stays the default.
    """
    name = os.environ.get(MODEL_SETTING, "").strip() or EMBEDDED
    if name not in KNOWN_NAMES and "/" not in name and not Path(name).is_dir():
        raise ModelUnavailable(f"{MODEL_SETTING}={name!r} names no model; use {EMBEDDED!r} (the default), "
                               f"{' or '.join(repr(n) for n in LARGER_MODELS)}, a hub name like 'owner/model', "
                               "or a local model directory.")
    return name


def model_config(name: str):
    """The shape of model `name` without loading its weights (a preset, or its Hugging Face config).

    Introduced in notebook 00 (where the time goes), which counts a decode step's FLOPs and
    bytes before it loads anything: ``model_config(course_model_name())``.
    """
    if name in PRESETS:
        return PRESETS[name]
    return config_from_hf(_read_hf_config(resolve_hf_source(name)), name=name)


def load_model(name: str = EMBEDDED, device=None, dtype=torch.float32, seed: int = 0):
    """labsupport's Transformer and its tokenizer: ``model, tokenizer = load_model("smollm2-135m")``.

    device: "cpu", "cuda", ... (default: the best available); dtype: a torch dtype,
    or "auto" for the fastest the device really supports (see hardware.pick_dtype).

    Notebook 00 (where the time goes).
    """
    device = pick_device(device)
    if dtype == "auto":
        from ..engine.hardware import pick_dtype
        dtype = pick_dtype(device)
    require_usable_dtype(device, dtype)
    if name in TINY:
        return random_model(name, seed=seed, device=device, dtype=dtype), ByteTokenizer()

    source = resolve_hf_source(name)
    from transformers import AutoTokenizer
    config = config_from_hf(_read_hf_config(source), name=name)
    state = _read_state_dict(source)
    model = model_from_state_dict(config, state, device=device, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(source)


def _read_hf_config(source: str):
    """The Hugging Face config of a directory or hub repository, or one sentence saying why not."""
    from transformers import AutoConfig

    directory = Path(source)
    if directory.is_dir():
        if (directory / "adapter_config.json").is_file():
            raise ModelUnavailable(
                f"{directory} holds a PEFT adapter (adapter_config.json), which labsupport does not apply; merge "
                "the adapter into its base model (peft's merge_and_unload) and load the merged model's directory."
            )
        if not (directory / "config.json").is_file():
            raise ModelUnavailable(f"{directory} has no config.json, so it is not a Hugging Face model directory; "
                                   "save the model with save_pretrained, or pass the directory that holds it.")
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelUnavailable(f"Could not read the model config of {source} ({first_line(err, limit=200, with_type=True)}); check its "
                               "config.json, or load the model with Hugging Face (load_hf_model) to see more.") from None


WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files that make up a model, as transformers chooses them:
    model.safetensors, else the shards that model.safetensors.index.json lists.
    Any other *.safetensors file in the directory (an adapter, a stray copy) is not the model's.
    Notebook 00 (where the time goes)."""
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    index = directory / WEIGHTS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
            if not all(isinstance(n, str) and n and Path(n).name == n and n not in (".", "..") for n in names):
                raise ValueError("a shard name is not a plain file name")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelUnavailable(f"The shard index {index} is damaged ({first_line(err, limit=200, with_type=True)}); download or save "
                                   "the model again.") from None
        absent = [n for n in names if not (directory / n).is_file()]
        if absent or not names:
            raise ModelUnavailable(f"The shard index {index} lists {absent[0] if absent else 'no file'!r}"
                                   f"{' (and more)' if len(absent) > 1 else ''}, which is not in {directory}; "
                                   "download or save the model again.")
        return [directory / n for n in names]
    strays = sorted(p.name for p in directory.glob("*.safetensors"))
    if strays:
        raise ModelUnavailable(
            f"{directory} holds {', '.join(strays[:3])}{' ...' if len(strays) > 3 else ''} but neither {WEIGHTS} "
            f"nor {WEIGHTS_INDEX}, so which files make up the model is unknown; save the model with save_pretrained."
        )
    raise ModelUnavailable(f"No safetensors weights in {directory}; labsupport loads safetensors checkpoints only.")


def _read_state_dict(source: str) -> dict[str, torch.Tensor]:
    """The model's safetensors weights (see `weight_files`) in one dict."""
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file

    directory = Path(source) if Path(source).is_dir() else Path(
        snapshot_download(source, allow_patterns=["*.safetensors", "*.json", "*.txt", "*.model"]))
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for f in weight_files(directory):
        try:
            tensors = load_file(str(f))
        except PermissionError:
            raise ModelUnavailable(f"You cannot read {f} (permission denied); ask its owner to make it readable "
                                   "(chmod a+r), or copy the model to a directory of your own.") from None
        except Exception as err:              # safetensors' own error type, OSError, ...
            raise ModelUnavailable(f"Could not read the weights file {f} ({first_line(err, limit=200, with_type=True)}); it is damaged or "
                                   "not a safetensors file: download or save the model again.") from None
        for name, tensor in tensors.items():
            if name in state:
                raise ModelUnavailable(f"The tensor {name!r} is stored both in {origin[name]} and in {f.name}, so "
                                       "which one is meant is unclear; download or save the model again.")
            state[name], origin[name] = tensor, f.name
    return state


def load_hf_model(name: str = EMBEDDED, device=None, dtype=torch.float32):
    """The Hugging Face model of the same weights: the peer every benchmark compares against.
    Notebook 02 (batching), and the peers of notebooks 05-07."""
    from transformers import AutoModelForCausalLM
    device = pick_device(device)
    require_usable_dtype(device, dtype)
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_source(name), dtype=dtype)
    return model.to(device).eval()
