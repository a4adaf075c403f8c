"""Building the course's own C++ kernels on first use, and loading them.

Introduced in notebook 04 (quantization: the W4A8 kernel, quant/w4a8.cpp); notebook 00 (where
the time goes) uses it too, for the fused norm and rotary kernels (models/fused_ops.cpp).

`try_build(source, kernels_dir, what, stem)` compiles one C++ file with torch.utils.cpp_extension
(10 to 60 s) into a folder named by a hash of the source, torch, Python and the compiler, under
the course's cache directory, and loads it into torch (its ops appear under torch.ops.labsupport).
A second process, or a second run, loads the cached build. Every way it can fail (no compiler, no
ninja, a cache that cannot be written, a compile error) is one sentence, returned, never raised:
the caller keeps a plain-torch path and says why.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch


def compiler() -> str:
    """The C++ compiler cpp_extension will call: $CXX, else c++ (as torch does on Linux and macOS).
    Notebook 04 (quantization)."""
    return os.environ.get("CXX", "").strip() or "c++"


def compiler_version(command: str) -> str | None:
    """The compiler's first --version line, or None when it cannot be run. Notebook 04."""
    words = shlex.split(command)
    if not words or shutil.which(words[0]) is None:
        return None
    try:
        done = subprocess.run([*words, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip().splitlines() or [""])[0] if done.returncode == 0 else None


def first_error(message: str) -> str:
    """The first compiler 'error' line of a failed build's output (or its first line). Notebook 04."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    found = next((line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)
                  and not line.startswith("Error building extension")), None)
    return (found or (lines[0] if lines else "no output"))[:200]


def openmp_flags(command: str, version: str) -> list[str]:
    """["-fopenmp"] when a kernel can share torch's OpenMP threads, else [] (one thread).

    Notebook 04 (quantization). at::parallel_for's threads are OpenMP pragmas in torch's
    headers, compiled into the kernel: without -fopenmp it runs on one thread. With GCC the
    extension links libgomp, the runtime torch's Linux wheels bring (same soname, loaded first:
    one thread pool). clang's OpenMP is a different runtime (libomp), and Apple's clang has none:
    there the kernel is single-threaded.
    """
    if not torch.backends.openmp.is_available() or "clang" in version.lower():
        return []
    probe = "#include <omp.h>\nint threads() { return omp_get_max_threads(); }\n"
    try:
        done = subprocess.run([*shlex.split(command), "-fopenmp", "-x", "c++", "-c", "-", "-o", os.devnull],
                              input=probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return ["-fopenmp"] if done.returncode == 0 else []


def find_ninja() -> None:
    """cpp_extension runs `ninja` from PATH; the `ninja` package (a dependency) installs it beside
    this Python, which is not on PATH in a virtual environment that was not activated: add it.
    Notebook 04 (quantization)."""
    beside = Path(sys.executable).parent
    if shutil.which("ninja") is None and shutil.which("ninja", path=str(beside)) is not None:
        os.environ["PATH"] = os.pathsep.join(filter(None, [str(beside), os.environ.get("PATH")]))


def try_build(source: Path, kernels_dir: Path, what: str, stem: str, flags: tuple[str, ...] = ()) -> str | None:
    """Build `source` into `kernels_dir`/<stem>-<hash> and load it; None when loaded, else the
    reason in one sentence (no final period). Notebook 04 (quantization).

    what: the kernel's name in messages ("the W4A8 kernel"); stem: the build folder's and the
    library's prefix; flags: extra compiler flags. The hash covers the source, the flags, torch,
    Python and the compiler, so a change of any of them builds afresh beside the old build.
    """
    command = compiler()
    version = compiler_version(command)
    if version is None:
        return (f"no C++ compiler was found ({command!r}; set CXX or install g++ or clang), "
                f"so {what} cannot be built")
    openmp = openmp_flags(command, version)
    cflags = ["-O3", *flags, *openmp]
    key = hashlib.sha256(b"\0".join([source.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                                     platform.machine().encode(), version.encode(),
                                     " ".join(cflags).encode()])).hexdigest()[:16]
    build_dir = kernels_dir / f"{stem}-{key}"
    name = f"labsupport_{stem}_{key}"
    library = build_dir / f"{name}.so"
    if library.is_file():                            # built before: load it (a read-only cache is fine)
        try:
            torch.ops.load_library(str(library))
            return None
        except OSError:                              # damaged (a build cut short): build it again
            pass
    try:
        from torch.utils import cpp_extension
    except Exception as error:                       # noqa: BLE001 - e.g. setuptools missing
        return f"torch.utils.cpp_extension cannot be imported ({error}), so {what} cannot be built"
    find_ninja()
    if not cpp_extension.is_ninja_available():
        return f"the ninja build tool is not installed (pip install ninja), so {what} cannot be built"
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return (f"the kernel cache {build_dir} cannot be written ({error.strerror}); "
                f"set LABSUPPORT_CACHE to a writable folder")
    start = time.perf_counter()
    try:
        cpp_extension.load(name=name, sources=[str(source)], extra_cflags=cflags, extra_ldflags=openmp,
                           build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as error:                       # noqa: BLE001 - a compile or link error
        return f"{what} did not build ({first_error(str(error))}; build folder {build_dir})"
    threads = "" if openmp else ", single-threaded: this compiler cannot use torch's OpenMP"
    print(f"Built {what} in {time.perf_counter() - start:.1f} s (cached in {build_dir}{threads}).")
    return None
