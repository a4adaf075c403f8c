"""Mutation testing holds every checker (issue 48): scripts/checker_mutants.py mutates each notebook's own
solution (an operator, a constant moved by one, a slice bound, two arguments swapped, a dropped term, ...)
and hands each mutant to the exercise's checker. The full run (`python scripts/checker_mutants.py`, about
7 minutes) must refuse at least 95% of the mutants that are not equivalent; here a spread sample of each
exercise's mutants runs, every one must be refused, and every mutant listed as equivalent must exist and
be accepted, so that a listed reason cannot go stale."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import checker_mutants as cm  # noqa: E402  (scripts/, after the path)

EXERCISES = cm.exercises()
SAMPLE = 5                      # mutants per exercise here, spread over its solution
cm.TIMEOUT_S = 20               # a mutant that loops is refused sooner here (the slowest solution checks in ~3 s)


def _sample(every: list, equivalent: dict) -> list:
    counted = [m for m in every if _key(m) not in equivalent]
    step = max(1, len(counted) // SAMPLE)
    return counted[::step][:SAMPLE]


def _key(mutant) -> str:
    return f"{mutant.line}:{mutant.col}:{mutant.kind}:{mutant.detail}"


def test_every_exercise_of_the_course_is_mutated():
    assert len(EXERCISES) >= 37
    assert all(cm.mutants(e) for e in EXERCISES), [e.id for e in EXERCISES if not cm.mutants(e)]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_the_checker_refuses_a_spread_sample_of_its_mutants(exercise):
    call = cm.call_for(exercise)
    outcome, said = cm.run(exercise, exercise.source, call)
    assert outcome == "accepted", f"the notebook's own solution is refused: {said}"
    equivalent = cm.equivalent_mutants().get(exercise.id, {})
    survivors = []
    for mutant in _sample(cm.mutants(exercise), equivalent):
        outcome, said = cm.run(exercise, mutant.source, call)
        if outcome != "refused":
            survivors.append(_key(mutant))
    assert not survivors, f"{exercise.id}: the checker accepts these mutants of the solution: {survivors}"


@pytest.mark.parametrize("exercise", [e for e in EXERCISES if cm.equivalent_mutants().get(e.id)],
                         ids=lambda e: e.id)
def test_every_mutant_listed_as_equivalent_exists_and_is_accepted(exercise):
    listed = cm.equivalent_mutants()[exercise.id]
    by_key = {_key(m): m for m in cm.mutants(exercise)}
    missing = sorted(set(listed) - set(by_key))
    assert not missing, f"{exercise.id}: listed as equivalent, but no such mutant of the solution: {missing}"
    call = cm.call_for(exercise)
    refused = [key for key in listed if cm.run(exercise, by_key[key].source, call)[0] == "refused"]
    assert not refused, f"{exercise.id}: listed as equivalent, yet the checker refuses them: {refused}"
    assert all(reason.strip() for reason in listed.values())


def test_the_mutator_makes_each_kind_of_change():
    exercise = cm.Exercise("00", "demo", "def f(xs, n):\n    ### BEGIN SOLUTION\n"
                           "    return min(xs[1:n]) + 2 * len(xs) > 0 and not f(xs, n)\n    ### END SOLUTION\n",
                           [(2, 4)], "check_demo(f)", "")
    kinds = {m.kind for m in cm.mutants(exercise)}
    assert kinds >= {"operator", "drop-term", "compare", "boolean", "unary", "constant", "slice", "name",
                     "swap-arguments"}
    assert all("### BEGIN" not in m.source or m.line > 2 for m in cm.mutants(exercise))
