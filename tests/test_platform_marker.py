"""The `platform` subset: the tests a torch version or a CPU feature can break (issue 47).

CI runs every test once (`make test`), then only this subset again: as on a CPU without bfloat16
(AVX2 kernels only), under the oldest torch the course supports and under the newest. A test file
that reaches one of the modules below (kernels, compile, CUDA graphs, dtypes, C++ builds, the
capability queries, torch.distributed, Hugging Face's model code, the GPU check, the simulated GPUs)
must hold at least one test marked `platform`, or those passes would never run it. The imports are
resolved, not read as text: ``from labsupport import pick_dtype`` reaches
labsupport.engine.hardware, where that function lives.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Module prefixes whose behaviour depends on the torch build, the CPU's instructions or
# transformers' version. A test file importing any of them (or a name they define) is a platform file.
PLATFORM_MODULES = (
    "labsupport.engine.compiled",           # torch.compile, cudagraph trees
    "labsupport.engine.graphs",             # CUDA graphs, compile counters
    "labsupport.engine.serving.decode_graphs",
    "labsupport.engine.quant",              # int8 / int4 kernels, W4A8 (C++), bitsandbytes
    "labsupport.engine.models.fused",       # the fused CPU ops (C++)
    "labsupport.engine.cpp_build",          # torch.utils.cpp_extension
    "labsupport.engine.hardware",           # capability queries: bf16, fp16, devices
    "labsupport.engine.precision",          # dtypes
    "labsupport.engine.kv_quant",           # int8 KV cache: quantized dtypes
    "labsupport.engine.parallel",           # torch.distributed (gloo, NCCL)
    "labsupport.lab.roofline_step_profile",          # torch.profiler's event names
    "labsupport.lab.step_timing",           # CUDA graphs around a step
    "labsupport.weights.hf_import",         # Hugging Face's model classes and checkpoints
    "gpu_check", "gpu_items",               # scripts/: the GPU check and its CPU rehearsal
    "simulated_gpu",                        # tests/: torch.cuda's queries patched
)


def _is_platform(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PLATFORM_MODULES)


def reached_modules(source: str) -> set[str]:
    """The modules a test file's imports reach: each imported module, each imported submodule, and
    the module that defines each imported name (``from labsupport.engine.quant import Int4Linear``
    reaches labsupport.engine.quant.kernels). Files loaded by path (scripts/gpu_check.py) count by their stem."""
    reached = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            reached.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            reached.add(node.module)
            for alias in node.names:
                reached.add(f"{node.module}.{alias.name}")
                if node.module.startswith("labsupport"):
                    owner = getattr(importlib.import_module(node.module), alias.name, None)
                    if isinstance(owner, types.ModuleType):
                        reached.add(owner.__name__)
                    elif getattr(owner, "__module__", None):
                        reached.add(owner.__module__)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            reached.add(Path(node.value).stem)                       # spec_from_file_location(..., "x.py")
    return reached


def marked_platform(source: str) -> bool:
    return "pytest.mark.platform" in source


def platform_files() -> dict[str, list[str]]:
    """Test file name -> the platform modules it reaches."""
    found = {}
    sys.path.insert(0, str(TESTS))
    try:
        for path in sorted(TESTS.glob("test_*.py")):
            hits = sorted(m for m in reached_modules(path.read_text()) if _is_platform(m))
            if hits:
                found[path.name] = hits
    finally:
        sys.path.remove(str(TESTS))
    return found


def test_every_test_file_that_reaches_a_platform_module_is_in_the_subset():
    left_out = {name: hits for name, hits in platform_files().items()
                if not marked_platform((TESTS / name).read_text())}
    assert not left_out, ("these test files reach modules a torch version or a CPU feature can break, and "
                          f"none of their tests is marked platform, so CI's later passes skip them: {left_out}")


def test_the_resolution_follows_a_name_to_the_module_that_defines_it():
    source = "from labsupport import pick_dtype\nfrom labsupport.engine.models import fused\n"
    reached = reached_modules(source)
    assert "labsupport.engine.hardware" in reached and "labsupport.engine.models.fused" in reached
    assert not any(_is_platform(m) for m in reached_modules("from labsupport.lab.tables import records_table\n"))
    spec = 'spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")'
    assert "gpu_check" in reached_modules(spec)


def test_the_marker_is_declared_and_ci_runs_the_subset_in_its_later_passes():
    root = TESTS.parent
    assert "platform:" in (root / "pyproject.toml").read_text()
    ci = (root / ".ci" / "run").read_text()
    assert ci.count('-m platform') >= 2 or ci.count('"platform') >= 1, "CI's later passes run the platform subset"


@pytest.mark.platform
def test_this_file_is_collected_in_the_subset():
    """`pytest -m platform` selects at least this test, so the selection itself is exercised."""
