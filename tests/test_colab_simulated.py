"""Every notebook's setup on a simulated Colab with a T4: `google.colab` importable and
torch.cuda answering as a T4 (tests/simulated_gpu.py).

The setup cell must not reinstall the course when it is importable, must print the GPU,
and every module a notebook imports must import there and choose the GPU's sizes. The
install itself on Colab is tested in test_delivery.py; no CUDA kernel runs here.
"""

import ast
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from labsupport.delivery import SETUP_MARKER
from labsupport.lab.workloads import PRESETS, preset

from simulated_gpu import GPUS, simulated

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def import_statements(nb) -> list[str]:
    """Every top-level import of the notebook's code cells (IPython magics left out)."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        found += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return found


@pytest.fixture
def colab_t4(monkeypatch):
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    with simulated(GPUS["T4"]) as gpu:
        yield gpu


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_setup_and_imports_on_a_colab_t4(path, colab_t4, capsys):
    nb = json.loads(path.read_text())
    setup = next(c for c in nb["cells"] if c["cell_type"] == "code")
    source = "".join(setup["source"])
    assert source.startswith(SETUP_MARKER)
    # The cell's install line is IPython syntax; on Colab with labsupport importable it is
    # skipped, so the cell runs as plain Python once that line is taken out.
    runnable = "\n".join(line for line in source.splitlines() if "%pip" not in line)
    namespace: dict = {}
    exec(compile(runnable, f"{path.name} setup cell", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "Running on Google Colab: device cuda (Tesla T4)" in printed and "bf16 in hardware: no" in printed

    for statement in import_statements(nb):
        exec(statement, namespace)
    assert preset(torch.device("cuda")) is PRESETS["gpu"]
