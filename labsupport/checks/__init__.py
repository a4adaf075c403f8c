"""Checkers for the notebooks' exercises, each module named by its notebook's stem (tests/test_stems.py):
roofline (00), kv_cache (01), batching (02), precision (03), quantization and quantization_* (04),
speculative and speculative_sampling (05), serving and serving_* (06, 06b), stack and stack_cost (07),
long_context and long_context_tiled (08), http_serving (09), tensor_parallel and tensor_parallel_goodput (10).
Shared: grading, reach. (`grading.graded` grades every checker by what the learner's code reaches and
does: each exercise declares the quantity it teaches, and the package code that computes it is refused;
`reach` is the walk behind it.)

A checker compares a learner's answer with the package's reference and either
prints a short confirmation or raises `CheckFailed` with what was expected, what
came back, and a hint. `CheckFailed` is a `LabError`, so in a notebook it shows as that message, not a
traceback, and still fails the cell (nbval and nbgrader count it).
"""

from __future__ import annotations

import functools
import sys
import warnings

from ..errors import LabError


class CheckFailed(LabError):
    """A learner's answer is not right yet; the message says why and hints at a fix.
    Raised by the exercise checkers of notebooks 00-07."""


def passed(exercise: str, detail: str = "") -> None:
    """Tell the learner an exercise is right. Used by the exercise checkers of notebooks 00-07."""
    print(f"Correct: {exercise}." + (f" {detail}" if detail else ""))


def fail(exercise: str, expected, got, hint: str) -> None:
    """Raise CheckFailed with the three things a learner needs.
    Used by the exercise checkers of notebooks 00-07."""
    raise CheckFailed(f"{exercise}: expected {expected}, got {got}. Hint: {hint}")


def call_learner(exercise: str, expected: str, hint, fn, *args):
    """fn(*args), the learner's code; if it raises, CheckFailed with `hint` (a string, or a function
    of the error). A stub's NotImplementedError passes through with its own message.
    Used by the exercise checkers of notebooks 01 and 02."""
    try:
        return fn(*args)
    except (NotImplementedError, CheckFailed):       # an exercise not done yet, or a refusal already worded
        raise
    except Exception as error:                       # noqa: BLE001 - the learner's code failed
        fail(exercise, expected, f"{type(error).__name__}: {str(error).rstrip('.')}",
             hint(error) if callable(hint) else hint)


def close_enough(got: float, expected: float, rel: float = 1e-6) -> bool:
    """True when `got` is within a relative tolerance `rel` of `expected`.
    Used by the exercise checkers of notebooks 00, 02, 03, 05 and 07."""
    return abs(got - expected) <= rel * max(abs(expected), 1e-12)


def grades_quietly(check):
    """Run a checker with Python's warnings silenced. Wraps every check_* of notebooks 00-07.

    nbgrader gives no points to a graded cell that wrote anything on stderr, and a checker
    runs the package's reference code (a kernel fallback, a library's deprecation notice),
    whose warnings would cost a right answer its points. The learner's own errors still
    raise, and a wrong answer still raises CheckFailed.
    """
    @functools.wraps(check)
    def quietly(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return check(*args, **kwargs)
    return quietly


def _learner_called(entry) -> bool:
    """True when a frame between the caller of a stand-in and `entry` (the checker's own frame)
    runs code outside labsupport (torch's and the standard library's wrappers aside): the
    learner's code, in a notebook or a test module."""
    frame = sys._getframe(2)
    while frame is not None and frame is not entry:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("labsupport.", "torch", "functools", "contextlib")):
            return True
        frame = frame.f_back
    return False


def _refusal(exercise: str, name: str) -> CheckFailed:
    return CheckFailed(f"{exercise}: expected your own code, got a call of the package's {name}. "
                       f"Hint: write the steps yourself; {name} is the answer this exercise rebuilds.")


def refuses_references(exercise: str, *references):
    """Wrap a checker so that the learner's code may not call the package's answer to the exercise.

    Used by the exercise checkers of notebooks 00-08. While the checker runs, every module
    global that is one of `references` (in labsupport, in the notebook's namespace `__main__`,
    in any imported module) is replaced by a stand-in. Called from the checker's own code, the
    stand-in runs the reference; called from the learner's code, it raises, and the checker
    raises CheckFailed with a hint to write it yourself, whatever the learner's code did next.
    A learner's function that *is* a reference (passed as itself) is refused the same way.
    """
    targets = {id(fn): fn for fn in references}

    def decorate(check):
        @functools.wraps(check)
        def guarded(*args, **kwargs):
            for value in list(args) + list(kwargs.values()):
                original = getattr(value, "func", value)               # a functools.partial of it too
                if id(original) in targets:
                    raise _refusal(exercise, original.__name__)
            entry, called, patched = sys._getframe(), [], []

            def stand_in(fn):
                @functools.wraps(fn)
                def refused(*a, **k):
                    if _learner_called(entry):
                        called.append(fn.__name__)
                        raise _refusal(exercise, fn.__name__)
                    return fn(*a, **k)
                return refused

            stand_ins = {key: stand_in(fn) for key, fn in targets.items()}
            for module in list(sys.modules.values()):
                try:
                    names = vars(module)
                except Exception:                                   # noqa: BLE001 - a lazy module proxy
                    continue
                if not isinstance(names, dict):
                    continue
                for name, value in list(names.items()):
                    if id(value) in targets and value is targets[id(value)]:
                        names[name] = stand_ins[id(value)]
                        patched.append((names, name, value))
            try:
                result = check(*args, **kwargs)
            except BaseException as error:
                if called:
                    raise _refusal(exercise, called[0]) from None
                raise error
            finally:
                for names, name, value in patched:
                    names[name] = value
            if called:                                                  # the learner caught the refusal
                raise _refusal(exercise, called[0])
            return result
        return guarded
    return decorate
