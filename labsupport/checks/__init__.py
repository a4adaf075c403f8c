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
