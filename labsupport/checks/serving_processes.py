"""What `check_block_hash` (notebook 06b, chunked prefill and prefix caching) needs to tell a stable hash from
Python's salted one: the learner's function run in two fresh Pythons of different hash seeds,
with the helpers it calls, and a watch on the built-in hash() while it runs in this process."""

from __future__ import annotations


def _program(fn) -> str:
    """A Python program of `fn`'s source and the sources of the functions and modules it uses
    (its helpers, found by name in its globals), for a fresh process to run alone."""
    import inspect, textwrap  # noqa: E401 - the one place these are needed
    sources, imports, seen = [], [], set()

    def names_of(code) -> set[str]:
        names = set(code.co_names)
        for const in code.co_consts:
            if inspect.iscode(const):
                names |= names_of(const)
        return names

    def visit(function) -> None:
        if function in seen:
            return
        seen.add(function)
        for name in sorted(names_of(function.__code__)):
            value = function.__globals__.get(name)
            if inspect.ismodule(value):
                imports.append(f"import {value.__name__} as {name}")
            elif inspect.isfunction(value):
                visit(value)
        sources.append(textwrap.dedent(inspect.getsource(function)))

    visit(fn)
    return "\n".join(["from __future__ import annotations", "import hashlib, struct, zlib",
                      *dict.fromkeys(imports), *sources])


def stable_across_processes(fn, cases) -> bool | None:
    """Same hashes from `fn` (with its helpers) in two Pythons of different hash seeds?
    None: its source cannot run alone in a fresh process. Notebook 06 (continuous batching)."""
    import os, subprocess, sys  # noqa: E401 - the one place these are needed
    try:
        program = f"{_program(fn)}\nprint([{fn.__name__}(p, t) for p, t in {cases!r}])"
    except (OSError, TypeError):
        return None
    runs = [subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    return None if any(r.returncode for r in runs) else runs[0].stdout == runs[1].stdout


def _salted(value) -> bool:
    """True for what Python's hash() salts per process: str and bytes, alone or inside a tuple."""
    if isinstance(value, (str, bytes)):
        return True
    return isinstance(value, (tuple, frozenset)) and any(_salted(item) for item in value)


def hashes_text(fn, cases) -> bool:
    """Did `fn` call the built-in hash() on a str or bytes (directly or through a helper)?
    Notebook 06 (continuous batching)."""
    import builtins
    real, seen = builtins.hash, []

    def spy(value):
        seen.append(_salted(value))
        return real(value)

    builtins.hash = spy
    try:
        for parent, tokens in cases:
            fn(parent, tokens)
    finally:
        builtins.hash = real
    return any(seen)
