"""The exercises work with nbgrader as committed: no hand editing before `generate_assignment`.

* Every notebook has at least one solution cell and each solution cell is followed by an
  autograded checker cell (nbgrader metadata: grade, points, locked), with unique ids.
* nbgrader's own `generate_assignment` and `autograde` run on one notebook in a throwaway
  course directory, for two submissions: the instructor's version (every solution in
  place) gets full marks, and the released student version (stubs) gets zero.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))
AUTOGRADED = "01_kv_cache.ipynb"      # the notebook graded end to end (one of the quicker ones)


def grading(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def exercise_pairs(nb) -> list[tuple[dict, dict | None]]:
    """(solution cell, the cell after it) for every solution cell of `nb`."""
    cells = nb["cells"]
    return [(cell, cells[i + 1] if i + 1 < len(cells) else None)
            for i, cell in enumerate(cells) if grading(cell).get("solution")]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_every_solution_cell_is_followed_by_its_autograded_checker(path):
    nb = json.loads(path.read_text())
    pairs = exercise_pairs(nb)
    assert pairs, f"{path.name} has no exercise"
    for solution, checker in pairs:
        name = grading(solution)["grade_id"]
        assert "### BEGIN SOLUTION" in "".join(solution["source"]), name
        assert checker is not None and checker["cell_type"] == "code", f"{name}: no checker cell after it"
        meta = grading(checker)
        assert meta.get("grade") is True and meta.get("locked") is True, f"{name}: checker cell not autograded"
        assert meta.get("points", 0) > 0 and not meta.get("solution"), f"{name}: checker cell without points"
        assert "check" in "".join(checker["source"]), f"{name}: the cell after it calls no checker"
    ids = [grading(c)["grade_id"] for c in nb["cells"] if grading(c)]
    assert len(ids) == len(set(ids)), f"{path.name}: repeated grade_id"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_each_notebook_has_a_substantial_exercise(path):
    """A warm-up is worth 1 point; each notebook has at least one exercise worth 3 or more."""
    nb = json.loads(path.read_text())
    points = [grading(c).get("points", 0) for c in nb["cells"] if grading(c).get("grade")]
    assert max(points, default=0) >= 3, f"{path.name}: only warm-ups ({points})"


def nbgrader(*args: str, root: Path) -> subprocess.CompletedProcess:
    """Run nbgrader's command line in the course directory `root` (its own venv's scripts on PATH:
    nbgrader runs `alembic` to create its gradebook)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={root}"]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_nbgrader_generates_and_autogrades_a_notebook_as_committed(tmp_path):
    pytest.importorskip("nbgrader")
    source = tmp_path / "source" / "ps1"
    source.mkdir(parents=True)
    shutil.copy(NOTEBOOKS / AUTOGRADED, source / AUTOGRADED)
    nbgrader("generate_assignment", "ps1", root=tmp_path)
    released = tmp_path / "release" / "ps1" / AUTOGRADED
    assert "### BEGIN SOLUTION" not in released.read_text()

    for student, version in (("instructor", source / AUTOGRADED), ("stubs", released)):
        submitted = tmp_path / "submitted" / student / "ps1"
        submitted.mkdir(parents=True)
        shutil.copy(version, submitted / AUTOGRADED)
    nbgrader("autograde", "ps1", "--ExecutePreprocessor.timeout=900", root=tmp_path)

    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gradebook:
        full = gradebook.find_submission("ps1", "instructor")
        stubs = gradebook.find_submission("ps1", "stubs")
        assert full.max_score >= 4
        assert full.score == full.max_score, "the reference solutions lose points"
        assert stubs.score == 0, "the stubs earn points: a checker accepts an unanswered exercise"
