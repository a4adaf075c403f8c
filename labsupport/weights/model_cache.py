"""Where converted models live: a cache built once, checked on every load, shareable.

Introduced in notebook 00 (where the time goes).

A cached model is a Hugging Face model directory (config.json, model.safetensors,
tokenizer files) plus a ``manifest.json`` with the source it was converted from and
each file's size and SHA-256, written last. A directory whose manifest is missing,
malformed or does not match, or that holds a file the manifest does not list, is
damaged: it is rebuilt, never loaded. The directory is built under a temporary name
and renamed into place, so a crash half-way leaves no half-written cache.

One cache can serve many users (a course server): it is built with the
builder's umask, like pip's and Hugging Face's caches (with the usual umask 022,
directories 0755 and files 0644), so every user can read it. A valid cache is
loaded without writing to it; a cache a user cannot read is reported as such,
never mistaken for damage; and every failure (no permission, a file in the way)
is one sentence that says what to do.

A build reads top to bottom: `inspect_cache`; if it is not valid, `begin_build`
(a fresh directory beside the cache, or one sentence saying why not); the caller
writes the model into it; `finish_build` (modes, manifest, rename into place).

Environment variable:
  LABSUPPORT_CACHE  where converted models live (default ~/.cache/labsupport)
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from pathlib import Path

from ..errors import ModelUnavailable

MANIFEST = "manifest.json"
REQUIRED_FILES = ("config.json", "model.safetensors")
PREPARE = 'python -c "from labsupport.weights.embedded import embedded_model_dir; embedded_model_dir()"'



# --- the manifest: write, read, validate ----------------------------------------------------------

def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_hex_digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _manifest_files(text: str, source: str) -> dict[str, dict] | None:
    """The manifest's {file name: {"size", "sha256"}} if it has exactly the expected form
    (converted from `source`), else None."""
    try:
        manifest = json.loads(text)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("source") != source:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return None
    for name, entry in files.items():
        plain = isinstance(name, str) and name == Path(name).name and name not in ("", ".", "..", MANIFEST)
        if not (plain and not name.startswith(".") and isinstance(entry, dict)
                and type(entry.get("size")) is int and entry["size"] >= 0 and _is_hex_digest(entry.get("sha256"))):
            return None
    return files


def _write_manifest(directory: Path, source: str) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")}
    (directory / MANIFEST).write_text(json.dumps({"source": source, "files": files}, indent=1))


def inspect_cache(directory: Path, source: str) -> tuple[str, str]:
    """The state of a cache directory and, unless valid, what is wrong, as (state, detail).

    Introduced in notebook 00 (where the time goes).

    source: what the model was converted from, as its manifest must record it.
    state: "valid"; "missing" (nothing there); "unreadable" (it exists, but this user may
    not read detail: permission, not damage); "blocked" (detail is a file, not a
    directory, where the cache should be); "damaged" (detail says how: the manifest is
    missing or malformed, a file is missing, changed, or not listed).
    Reading only: it never writes, so a cache the user cannot write is still valid.
    """
    try:
        if not directory.is_dir():
            if directory.exists():
                return "blocked", str(directory)
            return ("damaged", "it is a broken link") if directory.is_symlink() else ("missing", "")
        text = (directory / MANIFEST).read_text()
    except FileNotFoundError:
        return "damaged", f"no {MANIFEST}"
    except PermissionError as err:
        return "unreadable", err.filename or str(directory)
    except NotADirectoryError:
        return "blocked", str(directory)
    except (OSError, UnicodeDecodeError) as err:
        return "damaged", f"{MANIFEST} cannot be read ({type(err).__name__})"
    files = _manifest_files(text, source)
    if files is None:
        return "damaged", f"{MANIFEST} is not in the expected form"
    absent = [name for name in REQUIRED_FILES if name not in files]
    if absent:
        return "damaged", f"{MANIFEST} does not list {absent[0]}"
    try:
        entries = os.listdir(directory)
    except PermissionError:
        return "unreadable", str(directory)
    except OSError as err:
        return "damaged", f"its listing failed ({type(err).__name__})"
    for entry in sorted(entries):
        # hidden files (.nfs*, .ipynb_checkpoints) and folders are never read as part of the model
        if entry in files or entry == MANIFEST or entry.startswith(".") or (directory / entry).is_dir():
            continue
        return "damaged", f"it holds {entry}, which {MANIFEST} does not list"
    for name, entry in files.items():
        path = directory / name
        try:
            if not path.is_file():
                return "damaged", f"{name} is missing or not a file"
            if path.stat().st_size != entry["size"]:
                return "damaged", f"{name} has the wrong size"
            if _sha256(path) != entry["sha256"]:
                return "damaged", f"{name} does not match its checksum"
        except PermissionError:
            return "unreadable", str(path)
        except OSError as err:
            return "damaged", f"{name} cannot be read ({type(err).__name__})"
    return "valid", ""


def cache_is_valid(directory: Path, source: str) -> bool:
    """True when the manifest has the expected form, every file it lists is present with
    its size and hash, and the directory holds no other file (see `inspect_cache`).

    Introduced in notebook 00 (where the time goes).
    """
    return inspect_cache(directory, source)[0] == "valid"


# --- one sentence for each way the cache cannot be used or written --------------------------------

def _where(root: Path) -> str:
    """How to name the cache's place in a sentence: LABSUPPORT_CACHE's value, if it is set."""
    return f"{root} (LABSUPPORT_CACHE)" if os.environ.get("LABSUPPORT_CACHE", "").strip() else str(root)


def _root_problem(root: Path) -> str | None:
    """Why labsupport's cache root cannot hold the model directory, or None."""
    for part in (root, *root.parents):
        try:
            if part.exists() and not part.is_dir():
                return (f"{part} is a file, not a directory, so the model cache cannot live at {_where(root)}; "
                        "remove that file, or set LABSUPPORT_CACHE to a directory.")
        except PermissionError:
            return None                 # the mkdir in begin_build says so, in its own sentence
    return None


def cannot_write(directory: Path, state: str, detail: str, err: OSError) -> ModelUnavailable:
    """The one sentence for a cache in `state` (with `detail`, from `inspect_cache`) that this
    user may not create or rebuild (`err`: the permission error).

    Introduced in notebook 00 (where the time goes).
    """
    where = err.filename or directory.parent
    if state == "damaged":
        what = f"The model cache at {directory} is damaged ({detail}) and you cannot rebuild it"
        fix = (f"ask its owner to rebuild it (delete it, then run {PREPARE} as that user), "
               "or set LABSUPPORT_CACHE to a directory of your own")
    else:
        what = f"There is no model cache at {directory} yet and you cannot create one"
        fix = (f"set LABSUPPORT_CACHE to a directory you can write, or ask the owner of {directory.parent} "
               f"to build the cache there once with {PREPARE}")
    reason = "read-only file system" if err.errno == errno.EROFS else "permission denied"
    return ModelUnavailable(f"{what} ({reason} on {where}); {fix}.")


def _check_replaceable(directory: Path) -> None:
    """Raise PermissionError now, before a 20-second conversion, if the damaged cache in
    `directory` cannot be removed by this user (it is another user's)."""
    euid = os.geteuid() if hasattr(os, "geteuid") else 0            # Windows: let the removal itself fail
    if euid == 0 or not (directory.exists() or directory.is_symlink()):
        return
    parent = directory.parent
    ok = os.access(parent, os.W_OK | os.X_OK)
    if ok and parent.stat().st_mode & stat.S_ISVTX:                 # a sticky folder like /tmp
        ok = euid in (parent.stat().st_uid, directory.lstat().st_uid)
    if ok and directory.is_dir() and not directory.is_symlink():
        ok = os.access(directory, os.W_OK | os.X_OK)
    if not ok:
        raise PermissionError(errno.EACCES, "Permission denied", str(directory))


# --- the build: a directory beside the cache, shared by the umask, renamed into place --------------

def _make_building_dir(directory: Path) -> Path:
    """A fresh directory beside `directory`, created with the umask's mode (mkdtemp's is 0700)."""
    while True:
        path = directory.parent / f"{directory.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


def _share(building: Path) -> None:
    """Give every file the mode the umask gives new files (0644 under umask 022): some
    writers (safetensors among them) create files 0600, which other users cannot read."""
    umask = 0o777 & ~stat.S_IMODE(building.stat().st_mode)      # the directory was made 0777 & ~umask
    for path in building.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o666 & ~umask)


def _install(building: Path, directory: Path, source: str) -> None:
    """Move the finished build into place, replacing a damaged cache (unless another
    process has put a good one there meanwhile)."""
    if directory.is_dir() and cache_is_valid(directory, source):
        return
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory)
    try:
        os.replace(building, directory)
    except OSError:
        if not cache_is_valid(directory, source):  # else another process has just put a good cache there
            raise


def begin_build(directory: Path, state: str, detail: str) -> Path:
    """A fresh, empty build directory beside the cache `directory`, whose `inspect_cache`
    (state, detail) is not "valid"; the caller writes the model into it, then calls
    `finish_build`, and removes it in any case.

    Introduced in notebook 00 (where the time goes).

    Raises `ModelUnavailable` (one sentence) when the cache exists but this user cannot
    read it, when something is in its way, or when this user cannot write there.
    """
    root = directory.parent
    if state == "unreadable":
        raise ModelUnavailable(
            f"You may not read the model cache at {directory} (permission denied on {detail}); ask its owner "
            f"to make it readable to all (chmod -R a+rX {root}), or set LABSUPPORT_CACHE to a directory of "
            "your own."
        )
    if state == "blocked":
        raise ModelUnavailable(f"{detail} is a file, not the model directory that belongs there; remove it, "
                               "or set LABSUPPORT_CACHE to another directory.")
    problem = _root_problem(root)
    if problem:
        raise ModelUnavailable(problem)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _check_replaceable(directory)
        building = _make_building_dir(directory)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise cannot_write(directory, state, detail, err) from None
        raise ModelUnavailable(f"Could not create the model cache in {_where(root)} "
                               f"({type(err).__name__}: {err.strerror or err}); set LABSUPPORT_CACHE "
                               "to a directory you can write.") from None
    if state == "damaged":
        print(f"The model cache at {directory} is damaged or incomplete ({detail}); rebuilding it.")
    return building


def finish_build(building: Path, directory: Path, source: str, state: str, detail: str) -> None:
    """Give the files in `building` the umask's modes, write its manifest (converted from
    `source`) and rename it into place as `directory`.

    Introduced in notebook 00 (where the time goes).
    """
    _share(building)
    _write_manifest(building, source)
    try:
        _install(building, directory, source)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise cannot_write(directory, state, detail, err) from None
        raise
