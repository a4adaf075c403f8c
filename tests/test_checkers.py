"""The exercise checkers (labsupport/checks/, one module per notebook): each accepts the
reference solution and refuses each typical mistake with a hint that names it.

One table, `CASES`, in notebook order (its rows live in tests/checker_cases/, one module
per notebook): for each checker, the answers it must accept and the mistakes it must refuse, each with a regular expression its message must match (a
word of the hint). One parametrised test runs the table; ids read
`check_int4_pack-accepts-reference`, `check_int4_pack-refuses-swapped-nibbles`. A last
test fails for any `check_*` function of labsupport.checks that the table leaves out.
"""

import importlib
import inspect
import pkgutil
from typing import Callable

import pytest

import labsupport.checks
from labsupport.checks import CheckFailed
from checker_cases.common import Case
from checker_cases.nb00_roofline import NOTEBOOK_00
from checker_cases.nb01_kv_cache import NOTEBOOK_01
from checker_cases.nb02_batching import NOTEBOOK_02
from checker_cases.nb03_precision import NOTEBOOK_03
from checker_cases.nb04_quantization import NOTEBOOK_04
from checker_cases.nb05_speculative import NOTEBOOK_05
from checker_cases.nb06_serving import NOTEBOOK_06
from checker_cases.nb07_stack import NOTEBOOK_07
from checker_cases.nb08_long_context import NOTEBOOK_08
from checker_cases.nb09_http_serving import NOTEBOOK_09
from checker_cases.nb10_tensor_parallel import NOTEBOOK_10


CASES = (NOTEBOOK_00 + NOTEBOOK_01 + NOTEBOOK_02 + NOTEBOOK_03 + NOTEBOOK_04 + NOTEBOOK_05 + NOTEBOOK_06 + NOTEBOOK_07
         + NOTEBOOK_08 + NOTEBOOK_09 + NOTEBOOK_10)


def case_id(case: Case) -> str:
    return f"{case.checker.__name__}-{'accepts' if case.hint is None else 'refuses'}-{case.name}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_checker_accepts_the_reference_and_refuses_each_mistake(case, capsys):
    if case.hint is None:
        case.checker(*case.args)
        assert "Correct" in capsys.readouterr().out
    else:
        with pytest.raises(CheckFailed, match=case.hint):
            case.checker(*case.args)


def test_the_table_ids_are_unique():
    ids = [case_id(case) for case in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def checkers_in_the_package() -> list[Callable]:
    """Every `check_*` function defined in a module of labsupport.checks."""
    found = []
    for info in pkgutil.iter_modules(labsupport.checks.__path__):
        module = importlib.import_module(f"labsupport.checks.{info.name}")
        found += [fn for name, fn in inspect.getmembers(module, inspect.isfunction)
                  if name.startswith("check_") and fn.__module__ == module.__name__]
    return found


def test_every_checker_accepts_a_reference_and_refuses_a_mistake_in_the_table():
    checkers = checkers_in_the_package()
    assert len(checkers) >= 16
    accepted = {case.checker for case in CASES if case.hint is None}
    refused = {case.checker for case in CASES if case.hint is not None}
    missing = [f"{fn.__module__}.{fn.__name__}" for fn in checkers if fn not in accepted or fn not in refused]
    assert not missing, f"add to tests/checker_cases/ (its notebook's NOTEBOOK_xx list) the reference and a mistake of: {missing}"


def test_every_checker_runs_with_warnings_silenced(capsys):
    """nbgrader scores a graded cell 0 if it wrote on stderr: a warning from the reference code a
    checker runs must not cost a right answer its points."""
    import warnings

    from labsupport.checks import grades_quietly
    for fn in checkers_in_the_package():
        assert getattr(fn, "__wrapped__", None) is not None, f"{fn.__name__} is not @grades_quietly"

    @grades_quietly
    def check_noisy():
        warnings.warn("a kernel fell back")
        return "done"

    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # any warning that leaks would raise here
        assert check_noisy() == "done"


def test_no_accepted_answer_is_the_packages_own_function():
    """Issue 48: the table once accepted the package's answers (`accepts(check_block_hash, "reference",
    block_hash)`). An accepted answer is the learner's code: no callable argument of an accepts row is
    a labsupport function, and none reaches one that its exercise denies (labsupport.checks.grading)."""
    from labsupport.checks.grading import first_refused
    from labsupport.checks.reach import _is_package
    package_answers = [case_id(case) for case in CASES if case.hint is None
                       for arg in case.args if callable(arg) and not isinstance(arg, type) and _is_package(arg)]
    assert not package_answers, f"these accepted answers are the package's own functions: {package_answers}"
    reaching = [(case_id(case), str(first_refused(case.checker.exercise, arg))) for case in CASES if case.hint is None
                for arg in case.args if callable(arg) and first_refused(case.checker.exercise, arg) is not None]
    assert not reaching, f"these accepted answers reach the package's answer: {reaching}"
