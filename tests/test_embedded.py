"""The converted-weights cache: built atomically, verified, rebuilt when damaged."""

import json

import pytest

from labsupport.errors import ModelUnavailable
from labsupport.models import embedded


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
    assert embedded.cache_is_valid(first)
    assert embedded.embedded_model_dir() == first
    assert len(fake_conversion) == 1
    manifest = json.loads((first / embedded.MANIFEST).read_text())
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
        (directory / embedded.MANIFEST).unlink()
    else:
        weights.unlink()
    assert not embedded.cache_is_valid(directory)
    rebuilt = embedded.embedded_model_dir()
    assert embedded.cache_is_valid(rebuilt)
    assert len(fake_conversion) == 2
    assert "damaged" in capsys.readouterr().out


def test_a_crash_during_conversion_leaves_no_cache(monkeypatch, fake_conversion, tmp_path):
    def crash(gguf_path, directory):
        (directory / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        embedded.embedded_model_dir()
    root = embedded.cache_root()
    assert not (root / embedded.MODEL_DIR_NAME).exists()
    assert not list(root.glob("*building*"))


def test_a_wrong_gguf_path_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("LABSUPPORT_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelUnavailable, match="not a file"):
        embedded.find_gguf()
