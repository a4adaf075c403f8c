"""scripts/bench_against.py: the old revision beside this tree, A B B A, one table of the figures
both report. The bench and git calls are replaced by a recorder, so the test checks the order of
the rounds, which tree each runs from, the ratio and spreads, and that a figure one round lacks
is left out (not compared against nothing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_against.py"


@pytest.fixture
def against(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_against", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = []

    def run(command, cwd=None, check=False, capture_output=False):
        calls.append((command, cwd))
        if "bench" in command:                                 # a report: A's figures 1 and 3, B's 2 and 6
            side = "B" if Path(cwd) == module.HERE else "A"
            value = {"A": 1.0, "B": 2.0}[side] * (1.1 if len([c for c in calls if "bench" in c[0]]) > 2 else 1.0)
            figures = [{"name": "speed", "value": value}, {"name": "label", "value": "text"}]
            if len(calls) != 3:                                # the first round's "rare" figure only
                figures.append({"name": "rare", "value": 5.0})
            Path(command[command.index("--out") + 1]).write_text(json.dumps(
                {"sections": {"engines": {"figures": figures}, "note": "not a section"}}))

    monkeypatch.setattr(module.subprocess, "run", run)
    return module, calls


def test_rounds_alternate_and_the_table_compares_only_shared_figures(against, monkeypatch, tmp_path, capsys):
    module, calls = against
    out = tmp_path / "against.json"
    monkeypatch.setattr(sys, "argv", ["bench_against.py", "abc123", "--sections", "engines", "--out", str(out)])
    module.main()
    benches = [cwd for command, cwd in calls if "bench" in command]
    sides = ["B" if Path(cwd) == module.HERE else "A" for cwd in benches]
    assert sides == list(module.ORDER) == ["A", "B", "B", "A"]
    assert calls[0][0][:4] == ["git", "-C", str(module.HERE), "worktree"] and calls[0][0][-1] == "abc123"
    assert calls[-1][0][3:5] == ["worktree", "remove"]         # the worktree goes, whatever happened
    report = json.loads(out.read_text())
    (row,) = report["rows"]                                    # "rare" is missing from round 2: left out
    assert row["figure"] == "engines: speed" and row["values"] == pytest.approx([1.0, 2.0, 2.2, 1.1])
    assert row["b_over_a"] == pytest.approx(2.1 / 1.05)
    assert row["spread_a"] == pytest.approx(0.1 / 1.05) and row["spread_b"] == pytest.approx(0.2 / 2.1)
    assert "| engines: speed | 1 | 2 | 2.2 | 1.1 | 2.000 |" in capsys.readouterr().out


def test_spread_of_equal_rounds_is_zero_and_of_a_zero_mean_is_nan(against):
    module, _ = against
    assert module.spread([3.0, 3.0]) == 0.0
    assert module.spread([1.0, -1.0]) != module.spread([1.0, -1.0])
