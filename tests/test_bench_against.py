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


def test_an_unknown_revision_is_one_sentence_and_no_round_runs(against, monkeypatch, capsys):
    """Issue 50: git's refusal was a CalledProcessError traceback."""
    import subprocess
    module, calls = against

    def git_refuses(command, cwd=None, check=False, capture_output=False):
        calls.append((command, cwd))
        if "worktree" in command and "add" in command:
            raise subprocess.CalledProcessError(128, command, stderr=b"fatal: invalid reference: nosuchrev\n")
    monkeypatch.setattr(module.subprocess, "run", git_refuses)
    monkeypatch.setattr(sys, "argv", ["bench_against.py", "nosuchrev", "--sections", "engines"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    message = str(stop.value.code)
    assert "'nosuchrev'" in message and "invalid reference" in message and "\n" not in message
    assert not [command for command, _ in calls if "bench" in command]


@pytest.mark.parametrize("where", ["a-file/against.json", "a-folder", "/proc/no/such/against.json"])
def test_an_unwritable_out_stops_before_the_first_round(against, monkeypatch, tmp_path, where):
    """Issue 50: --out was first written after all four rounds."""
    module, calls = against
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    out = tmp_path / where
    monkeypatch.setattr(sys, "argv", ["bench_against.py", "abc123", "--sections", "engines", "--out", str(out)])
    with pytest.raises(SystemExit) as stop:
        module.main()
    message = str(stop.value.code)
    assert message.startswith("bench_against: cannot write --out") and "\n" not in message
    assert calls == []                                        # no worktree, no round
    assert (tmp_path / "a-file").read_text() == "x"


def test_an_existing_writable_out_is_kept_until_the_table_replaces_it(against, monkeypatch, tmp_path):
    module, _ = against
    out = tmp_path / "against.json"
    out.write_text("old")
    monkeypatch.setattr(sys, "argv", ["bench_against.py", "abc123", "--sections", "engines", "--out", str(out)])
    module.main()
    assert json.loads(out.read_text())["revision"] == "abc123"


def test_a_failed_round_is_one_sentence_and_the_worktree_goes(against, monkeypatch):
    import subprocess
    module, calls = against

    def bench_fails(command, cwd=None, check=False, capture_output=False):
        calls.append((command, cwd))
        if "bench" in command:
            raise subprocess.CalledProcessError(2, command)
    monkeypatch.setattr(module.subprocess, "run", bench_fails)
    monkeypatch.setattr(sys, "argv", ["bench_against.py", "abc123", "--sections", "engines"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert "exit status 2" in str(stop.value.code) and "\n" not in str(stop.value.code)
    assert calls[-1][0][3:5] == ["worktree", "remove"]
