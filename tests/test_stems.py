"""One stem per notebook in every folder above the engine (issue 47): lab/, bench/, claims/, checks/,
plots/ and explorers/ name a notebook's modules by that notebook's stem (`<stem>.py` or
`<stem>_<part>.py`), so a learner finds notebook 04's checkers, figures and measurements under one
word. A module that several notebooks share says so in its folder's docstring ("Shared: ...").
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
FOLDERS = ("lab", "bench", "claims", "checks", "plots", "explorers")

# notebook number -> its stem; 06b continues 06's topic (the serving engine) under the same stem
STEMS = {"00": "roofline", "01": "kv_cache", "02": "batching", "03": "precision", "04": "quantization",
         "05": "speculative", "06": "serving", "06b": "serving", "07": "stack", "08": "long_context",
         "09": "http_serving", "10": "tensor_parallel"}
ORDER = list(dict.fromkeys(STEMS.values()))          # the stems in reading order


def stem_of(module: str) -> str | None:
    """The notebook stem a module name starts with (the longest that fits), or None."""
    fits = [s for s in ORDER if module == s or module.startswith(s + "_")]
    return max(fits, key=len) if fits else None


def modules(folder: str) -> list[str]:
    """The modules and subpackages directly in labsupport/<folder>/."""
    package = importlib.import_module(f"labsupport.{folder}")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__))


def shared(folder: str) -> set[str]:
    """The modules a folder's docstring declares shared: its line "Shared: a, b, c." (may wrap)."""
    doc = importlib.import_module(f"labsupport.{folder}").__doc__ or ""
    match = re.search(r"Shared:([^.]*)\.", doc)
    return set(re.findall(r"\w+", match.group(1))) if match else set()


def notebook_imports(path: Path) -> set[str]:
    """Every labsupport module a notebook's code cells import (names resolved to modules)."""
    found = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = [ln for ln in "".join(cell["source"]).splitlines() if not ln.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("labsupport"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labsupport"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if _is_module(m)}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_every_module_is_named_by_its_notebook_or_declared_shared():
    for folder in FOLDERS:
        declared = shared(folder)
        names = modules(folder)
        stray = [m for m in names if stem_of(m) is None and m not in declared]
        assert not stray, (f"labsupport/{folder}/: {stray} are named by no notebook's stem ({sorted(set(ORDER))}) "
                           f"and not declared shared in the folder's docstring")
        stale = declared - set(names)
        assert not stale, f"labsupport/{folder}/'s docstring declares {sorted(stale)} shared, and no such module exists"
        named_shared = [m for m in declared if stem_of(m) is not None]
        assert not named_shared, f"labsupport/{folder}/: {named_shared} carry a notebook's stem and are declared shared"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:3].rstrip("_"))
def test_a_notebook_imports_its_own_stem_an_earlier_ones_or_shared_modules(path):
    number = path.name.split("_")[0]
    own = STEMS[number]
    earlier = set(ORDER[:ORDER.index(own) + 1])
    for module in sorted(notebook_imports(path)):
        parts = module.split(".")
        if len(parts) < 3 or parts[1] not in FOLDERS:
            continue
        folder, name = parts[1], parts[2]
        if name in shared(folder):
            continue
        stem = stem_of(name)
        if folder in ("checks", "claims", "explorers", "plots"):
            assert stem == own, f"{path.name} imports {module}: its {folder} must be {own}'s (one stem per notebook)"
        else:
            assert stem in earlier, f"{path.name} imports {module}, which belongs to a later notebook ({stem})"


def test_the_stems_are_the_bench_sections_of_their_notebooks():
    """Each notebook's bench section carries its stem as its name, so `--sections <stem>` runs it."""
    from labsupport.bench.suite import SECTIONS
    assert set(ORDER) <= set(SECTIONS), sorted(set(ORDER) - set(SECTIONS))


def test_every_notebook_has_a_stem_and_the_stem_finder_takes_the_longest():
    assert {p.name.split("_")[0] for p in NOTEBOOKS} == set(STEMS)
    assert stem_of("http_serving_loadgen") == "http_serving" and stem_of("serving_decode_cost") == "serving"
    assert stem_of("quantize") is None and stem_of("servings") is None


def test_the_peer_adapters_live_in_their_own_subfolder():
    assert {"huggingface", "continuous_batching", "llamacpp", "http_servers"} <= set(
        m.name for m in pkgutil.iter_modules(importlib.import_module("labsupport.bench.peers").__path__))
    assert not {"peers.py", "serving_peers.py", "http_peers.py", "llamacpp.py"} & {
        p.name for p in (ROOT / "labsupport" / "bench").glob("*.py")}
