"""No checker is exempt from grading by reach (issue 48; labsupport/checks/grading.py).

* Every `check_*` of labsupport.checks grades through an `Exercise` (the `graded` decorator).
* Every package callable a learner's notebook can reach that an exercise denies is refused, whichever
  way the learner's function holds it: the list is the walk's own (every module the notebooks import,
  and every attribute of those modules, recursively), never written by hand.
* No package callable passes as the answer: each engine and weights function, and each method of the
  objects a checker passes in, is tried as the learner's function; a checker that accepts one has a
  hole (its exercise must declare that callable in `computed_by`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import pkgutil
import resource
import sys
import types
from pathlib import Path

import pytest
import torch

import labsupport
import labsupport.checks
from labsupport.checks import CheckFailed
from labsupport.checks.grading import EXERCISES, UPPER_LAYERS, denied_members

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import checker_mutants  # noqa: E402  (scripts/, after the path)


def checkers() -> dict[str, types.FunctionType]:
    found = {}
    for info in pkgutil.iter_modules(labsupport.checks.__path__):
        module = importlib.import_module(f"labsupport.checks.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("check_") and fn.__module__ == module.__name__:
                found[name] = fn
    return found


CHECKERS = checkers()


def test_every_checker_grades_through_an_exercise():
    exempt = sorted(name for name, fn in CHECKERS.items() if getattr(fn, "exercise", None) is None)
    assert not exempt, f"these checkers do not grade by reach (labsupport.checks.grading.graded): {exempt}"
    assert set(CHECKERS) <= set(EXERCISES)


def test_every_exercise_names_real_package_code():
    for name, exercise in EXERCISES.items():
        deny = exercise.denied()                                   # resolves every dotted path, or raises
        assert exercise.teaches and exercise.title, name
        for path in exercise.computed_by + exercise.allowed + exercise.receives:
            assert path.startswith("labsupport."), (name, path)
        assert deny.callables or exercise.receives or exercise.computed_by == (), name


@functools.cache
def package_modules() -> list[types.ModuleType]:
    """Every module of labsupport a notebook can import (the serving stack included)."""
    found = []
    for info in pkgutil.walk_packages(labsupport.__path__, "labsupport."):
        if info.name.endswith("__main__"):
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ImportError:                                        # an optional extra that is not installed
            continue
    return found


@functools.cache
def reachable_package_callables() -> dict[str, object]:
    """Every function and class defined in labsupport, by qualified name: what the notebook's
    `import labsupport as ls` reaches through module attributes."""
    found = {}
    for module in package_modules():
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if isinstance(value, (types.FunctionType, type)):
                found[f"{module.__name__}.{name}"] = value
    return found


def denied_for(exercise) -> dict[str, object]:
    """The reachable package callables the exercise denies: the layers above the engine, what it declares
    computes its quantity, and the methods of the classes it passes in (minus what it allows)."""
    deny = exercise.denied()
    found = {path: obj for path, obj in reachable_package_callables().items()
             if deny.refuses(obj) is not None}
    for cls in deny.classes:
        for name, member in denied_members(cls):
            if name in deny.attributes:
                found[f"{cls.__name__}.{name}"] = ("attribute", name)
    return found


def _holder(target):
    """Three learner functions that hold `target`: as a default argument, in a closure, through a helper."""
    if isinstance(target, tuple):                                   # ("attribute", name): read off an argument
        name = target[1]
        return [eval(f"lambda *args: getattr(args[0], {name!r})")]  # noqa: S307 - a literal attribute read

    def by_default(*args, _hidden=target):
        return _hidden(*args)

    def closure():
        hidden = target
        return lambda *args: hidden(*args)

    def helper(*args):
        return by_default(*args)
    return [by_default, closure(), helper]


@pytest.mark.parametrize("checker", sorted(CHECKERS))
def test_every_denied_package_callable_is_refused_whichever_way_it_is_held(checker):
    fn = CHECKERS[checker]
    exercise = getattr(fn, "exercise", None)
    if exercise is None:
        pytest.fail(f"{checker} is not graded by reach")
    denied = denied_for(exercise)
    assert denied, checker
    slots = max(len(SLOTS.get(checker, [])), 1)
    for path, target in denied.items():
        for holder in _holder(target):
            with pytest.raises(CheckFailed, match="expected your own code, got a call of the package's"):
                fn(*([holder] * slots))


def _slots() -> dict[str, list[str]]:
    """checker name -> the solution functions its notebook's check cell hands it, in order."""
    found = {}
    for exercise in checker_mutants.exercises():
        calls = [n for n in ast.walk(ast.parse(exercise.check or "pass")) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id.startswith("check_")]
        if not calls:
            continue
        defined = {n.name: n for n in ast.parse(exercise.source).body if isinstance(n, ast.FunctionDef)}
        found[calls[0].func.id] = [a.id for a in calls[0].args if isinstance(a, ast.Name) and a.id in defined]
        found[calls[0].func.id + ".arity"] = [len(defined[a].args.args) for a in found[calls[0].func.id]]
    return found


SLOTS = _slots()


def engine_candidates(arity: int) -> dict[str, object]:
    """The engine's and the weights' public functions (and classes) a learner's function of `arity`
    positional arguments could stand for: every one whose signature takes that many."""
    found = {}
    for path, value in reachable_package_callables().items():
        if path.startswith(UPPER_LAYERS) or not path.startswith(("labsupport.engine", "labsupport.weights")):
            continue
        if path.startswith("labsupport.engine.parallel"):           # starts processes that re-run pytest
            continue
        try:
            parameters = list(inspect.signature(value).parameters.values())
        except (TypeError, ValueError):
            continue
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        if any(p.kind == p.VAR_POSITIONAL for p in parameters) or len(required) <= arity <= len(positional):
            found[path] = value
    return found


@contextlib.contextmanager
def memory_capped(extra_gib: float):
    """The process's address space capped at what it holds now plus `extra_gib`, for the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        now = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (now + int(extra_gib * 2**30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def cannot_pass_on_the_ranks(checker: str, candidate) -> bool:
    """check_mlp_split runs the answer in two rank processes (about 2.6 s a candidate). There each rank must
    return a (tokens, hidden) tensor after exactly one all-reduce; a candidate that, run here as rank 0 on the
    same cases (its all-reduces counted, summing over nobody), raises or returns anything else cannot pass
    there, and is not sent."""
    if checker != "check_mlp_split":
        return False
    from labsupport.checks import tensor_parallel as tp
    for case in tp._mlp_cases():
        sent = []
        try:
            out = tp._call(candidate, case, *tp._masked(case["gate_up"], case["down"], 0, tp.WORLD), 0, tp.WORLD,
                           sent, False)
        except Exception:                                                   # noqa: BLE001 - it raises on the ranks too
            return True
        if not (isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(case["x"].shape) and len(sent) == 1):
            return True
    return False


def test_the_rank_zero_filter_keeps_a_right_split():
    """The filter above sends a right split to the ranks (else it would hide a hole), and not a wrong one."""
    def mlp_on_rank(x, gate_up, down, rank, world, all_reduce):
        inner = down.shape[1]
        mine = slice(rank * inner // world, (rank + 1) * inner // world)
        gate, up = gate_up[:inner][mine], gate_up[inner:][mine]
        return all_reduce((torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down[:, mine].T)
    assert not cannot_pass_on_the_ranks("check_mlp_split", mlp_on_rank)
    assert cannot_pass_on_the_ranks("check_mlp_split", lambda x, gate_up, down, rank, world, all_reduce: x)


@pytest.mark.parametrize("checker", sorted(c for c in CHECKERS if len(SLOTS.get(c, [])) == 1))
def test_no_package_callable_passes_as_the_answer(checker, capsys):
    fn = CHECKERS[checker]
    arity = SLOTS[checker + ".arity"][0]
    passed = []
    for path, candidate in engine_candidates(arity).items():
        if cannot_pass_on_the_ranks(checker, candidate):
            continue
        def answer(*args, _package=candidate):
            return _package(*args)
        try:
            with memory_capped(extra_gib=4):                        # a cache sized by a huge answer fails, not the test
                fn(answer)
        except (Exception, SystemExit):                             # noqa: BLE001 - refused, or it broke: no hole
            continue
        finally:
            said = capsys.readouterr().out
        if "Correct" in said:
            passed.append(path)
    assert not passed, (f"{checker} accepts the package's own {passed} as the learner's answer: declare them in "
                        "its exercise's computed_by")
