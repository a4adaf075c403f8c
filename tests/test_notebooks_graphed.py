"""Issue 35: on a GPU every timed decode in the notebooks replays a CUDA graph.

A notebook cell that times (time_side_by_side, time_fn, or reads decode_seconds) must pass
`compile=` to every `generate(...)` / `speculative_generate(...)` it makes: generate's default
is eager, which on a GPU measures kernel launches. The lab helpers and bench sections are
tested on simulated GPUs in test_gpu_graphed.py; this reads the notebooks' own cells.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
TIMES = re.compile(r"time_side_by_side|decode_seconds|time_fn\(")
CALL = re.compile(r"(?<![\w.])(?:ls\.)?(?:speculative_)?generate\(")


def calls(source: str):
    """Each `generate(...)` call in `source`, its text up to the matching parenthesis."""
    for match in CALL.finditer(source):
        end, depth = match.end(), 1
        while depth and end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        yield source[match.start():end]


def test_the_call_reader_finds_each_call_whole():
    source = "x = ls.generate(m, f(a, b), 3)\ny = speculative_generate(t, d, ids, compile=G)\nz = hf_generate(q)"
    assert list(calls(source)) == ["ls.generate(m, f(a, b), 3)", "speculative_generate(t, d, ids, compile=G)"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_timed_generate_in_a_notebook_asks_for_the_graphed_step(path):
    eager = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and TIMES.search(source):
            eager += [f"{cell.get('id')}: {call[:80]}" for call in calls(source) if "compile=" not in call]
    assert not eager, f"timed without compile= (eager on a GPU): {eager}"
