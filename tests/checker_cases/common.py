"""One row of the checker table (tests/test_checkers.py): a call of a checker and what it must say."""

from typing import Callable, NamedTuple


class Case(NamedTuple):
    """One call of a checker and what it must say."""
    checker: Callable
    name: str                 # the answer in a few words: "reference", or the mistake it makes
    args: tuple               # what the checker is called with (the learner's functions, or an answer)
    hint: str | None = None   # None: accepted; else a regular expression its CheckFailed message matches


def accepts(checker, name, *args):
    return Case(checker, name, args)


def refuses(checker, name, hint, *args):
    return Case(checker, name, args, hint)
