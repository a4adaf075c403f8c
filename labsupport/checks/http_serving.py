"""Checkers for notebook 09 (serving over HTTP): reading a stream of server-sent events, the
text a server must hold back while it may still be the start of a stop string, and the answer to
a multiple-choice question from the prompt log-probabilities a server echoes. Each compares a
learner's function with the reference and prints a short confirmation or raises `CheckFailed`;
the learner's code is graded by what it reaches (`labsupport.checks.grading`).
"""

from __future__ import annotations

import json

from ..lab.http_serving_quality import best_choice
from ..serve.text import held_back
from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded

SSE = "reading a stream of server-sent events"
HOLD = "the text held back for stop strings"
CHOICE = "a multiple-choice answer from prompt log-probabilities"

SSE_EXERCISE = Exercise(title=SSE, teaches="the chunks of a stream of server-sent events, each data line's JSON up "
                                           "to data: [DONE]")
HOLD_EXERCISE = Exercise(title=HOLD, teaches="the length of the longest ending of a text that begins a stop string")
CHOICE_EXERCISE = Exercise(title=CHOICE, teaches="the index of the choice whose own tokens have the largest summed "
                                                 "log-probability")


def reference_parse_sse(body: str) -> list[dict]:
    """The JSON chunks of an OpenAI-style event stream, in order, up to ``data: [DONE]``.
    Introduced in notebook 09 (serving over HTTP). Events are separated by a blank line; a
    line ``data: {...}`` carries one chunk; other lines (comments such as ``: ping``) carry none."""
    chunks = []
    for line in body.splitlines():
        if not line.startswith("data: "):
            continue
        if line[len("data: "):] == "[DONE]":
            break
        chunks.append(json.loads(line[len("data: "):]))
    return chunks


def _sse_cases() -> list[tuple[str, str]]:
    one = {"choices": [{"index": 0, "text": "Hel", "finish_reason": None}]}
    two = {"choices": [{"index": 0, "text": "lo", "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"completion_tokens": 2}}
    event = lambda c: f"data: {json.dumps(c)}\n\n"                            # noqa: E731
    return [(event(one) + event(two) + "data: [DONE]\n\n", "two chunks, then [DONE]"),
            (": ping\n\n" + event(one) + ": ping\n\n" + event(two) + event(usage) + "data: [DONE]\n\n",
             "keep-alive comments between the chunks, and a usage chunk"),
            (event(one) + "data: [DONE]\n\n" + event(two), "something after [DONE], which ends the stream"),
            ("data: [DONE]\n\n", "an answer with no chunk at all")]


def _chunks(count: int) -> str:
    return f"{count} chunk" + ("" if count == 1 else "s")


def _sse_hint(body: str, count: int) -> str:
    """What a learner's count of chunks says: it read past [DONE], counted comments, or missed some."""
    lines = body.splitlines()
    if count == sum(line.startswith("data: ") and line != "data: [DONE]" for line in lines):
        return "stop at `data: [DONE]`: it ends the stream."
    if count > len(reference_parse_sse(body)) and any(line.startswith(":") for line in lines):
        return "lines that start with ':' are comments (keep-alives), not chunks: only a `data: {...}` line holds one."
    return "every `data: {...}` line before [DONE] is one chunk; lines that start with ':' are comments."


@grades_quietly
@graded(SSE_EXERCISE)
def check_parse_sse(fn) -> None:
    """Check `fn(body) -> list of dicts`: the chunks of an event stream up to [DONE].

    Introduced in notebook 09 (serving over HTTP)."""
    for body, about in _sse_cases():
        want = reference_parse_sse(body)
        got = call_learner(SSE, "a list of dicts", "parse each `data: ` line's JSON with json.loads, and stop at "
                           "`data: [DONE]`, which is not JSON.", fn, body)
        if not isinstance(got, list) or not all(isinstance(c, dict) for c in got):
            fail(SSE, "a list of dicts (json.loads of each chunk)", repr(got)[:80],
                 f"turn each line's text after 'data: ' into a dict with json.loads. Case: {about}")
        if len(got) != len(want):
            fail(SSE, _chunks(len(want)), _chunks(len(got)), f"{_sse_hint(body, len(got))} Case: {about}")
        wrong = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        if wrong is not None:
            fail(SSE, f"chunk {wrong} {want[wrong]!r}"[:100], repr(got[wrong])[:80],
                 f"json.loads the whole text after 'data: ' of each line. Case: {about}")
    passed(SSE, "The load generator reads every server's stream this way (labsupport.lab.http_serving_loadgen).")


def _hold_cases() -> list[tuple[str, list[str], str]]:
    return [("Hello wor", ["world"], "the text ends with the first three letters of the stop string"),
            ("Hello", ["\n\n"], "no ending starts the stop string"),
            ("The end.\n", ["\n\n", "END"], "the ending '\\n' starts the first stop string"),
            ("abcab", ["abcd"], "the ending 'ab' starts the stop string, though the text began with more of it"),
            ("I said E", ["\n\n", "END"], "the second stop string's start"),
            ("xxEN", ["ENOUGH", "END"], "two stop strings start with the same ending"),
            ("aaaa", ["aaab"], "endings of several lengths start it: the longest is 3"),
            ("say ab", ["bd", "abc"], "the first stop string that matches gives 1, a later one 2"),
            ("say ab", ["abc", "bd"], "a later stop string matches a shorter ending than an earlier one"),
            ("x abc", ["ab", "abcd"], "one stop string is the beginning of another"),
            ("the END", ["END"], "the text ends with a whole stop string, which already ended the answer"),
            ("", ["stop"], "no text yet"),
            ("tops", ["stop"], "the stop string's letters in another order"),
            ("Hi", [], "no stop strings")]


def _hold_hint(text: str, stops: list[str], got: int, want: int) -> str:
    """The slip `got` makes: one stop string's ending instead of the longest over all, a whole stop
    string held back, or (else) too little or too much held."""
    each = [max((k for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0) for stop in stops]
    matched = [n for n in each if n]
    if matched and got in (matched[0], matched[-1]) and got < want:
        which = "first" if got == matched[0] else "last"
        return (f"that is the {which} matching stop string's ending: keep the longest over every stop string, "
                f"longest = max(longest, k), whichever stop string gives it.")
    if got > want and any(text.endswith(stop) and got == len(stop) for stop in stops if stop):
        return ("a whole stop string has already ended the answer, so it is not held back: only an ending that is "
                "a beginning shorter than the stop string waits (k from 1 to len(stop) - 1).")
    if got < want:
        return ("an ending that is only the BEGINNING of a stop string must wait too; test every length k "
                "from 1 to len(stop) - 1, and keep the longest.")
    return ("hold back only an ending that a stop string starts with (text.endswith(stop[:k])), "
            "and never the whole text for nothing.")


@grades_quietly
@graded(HOLD_EXERCISE)
def check_held_back(fn) -> None:
    """Check `fn(text, stops) -> int`: the length of the longest ending of `text` that is the
    beginning (not the whole) of a stop string. Introduced in notebook 09 (serving over HTTP)."""
    for text, stops, about in _hold_cases():
        want = held_back(text, stops)
        got = call_learner(HOLD, f"{want}", "loop over the stop strings and over the lengths k of their beginnings, "
                           "and test text.endswith(stop[:k]).", fn, text, list(stops))
        if not isinstance(got, int) or isinstance(got, bool):
            fail(HOLD, "an int (a number of characters)", repr(got)[:60],
                 "return how many characters at the end of the text to hold back.")
        if got != want:
            fail(HOLD, str(want), str(got), f"{_hold_hint(text, stops, got, want)} Case: text {text!r}, stops "
                                            f"{stops} ({about})")
    passed(HOLD, "The server sends everything before the held-back ending, token by token.")


def _choice_cases() -> list[tuple[list, list[int], str]]:
    """(log-probabilities per choice as a server echoes them, the choice's own token counts, what
    the case tests). The question is 2 tokens; each list starts with None (the first token)."""
    return [([[None, -2.0, -1.0], [None, -2.0, -0.2], [None, -2.0, -3.0]], [1, 1, 1],
             "one token per choice: the most likely one"),
            ([[None, -2.0, -1.0], [None, -2.0, -0.5, -0.5, -0.5]], [1, 3],
             "choices of different lengths: the sum, not the mean, of each choice's own tokens"),
            ([[None, -2.0, -3.0, -0.1], [None, -2.0, -0.5, -0.5]], [2, 2],
             "two tokens per choice: the first of them counts too"),
            ([[None, -5.0, -1.0], [None, -0.1, -2.0]], [1, 1],
             "the question's tokens scored differently (a tokenization that merged across the join): left out"),
            ([[None, -0.7, -0.2, -0.4]], [2], "a single choice")]


@grades_quietly
@graded(CHOICE_EXERCISE)
def check_best_choice(fn) -> None:
    """Check `fn(log_probs, lengths) -> int`: the index of the choice whose own last lengths[i]
    tokens have the largest summed log-probability. Introduced in notebook 09 (serving over HTTP)."""
    for log_probs, lengths, about in _choice_cases():
        want = best_choice(log_probs, lengths)
        got = call_learner(CHOICE, f"choice {want}", lambda error: (
            "the first log-probability is None (nothing precedes the first token): sum only the last "
            "lengths[i] of each list." if isinstance(error, TypeError) else
            "for each choice sum the last lengths[i] log-probabilities, then return the index of the largest."),
            fn, [list(lp) for lp in log_probs], list(lengths))
        if isinstance(got, bool) or not hasattr(got, "__index__"):
            fail(CHOICE, "an int (the index of a choice)", repr(got)[:60], "return the index, not the score.")
        if int(got) == want:
            continue
        sums = [sum(lp[len(lp) - n:]) for lp, n in zip(log_probs, lengths)]
        mistakes = {   # what each typical mistake would pick, and the hint that names it
            "each choice's own tokens are the last lengths[i] of its list, all of them (lp[-n:]), the first too.":
                [sum(lp[len(lp) - n + 1:]) for lp, n in zip(log_probs, lengths)],
            "sum the choice's log-probabilities: the mean favours a long choice of likely tokens (lm-eval's acc sums).":
                [total / n for total, n in zip(sums, lengths)],
            "leave the question's tokens out: sum only each choice's own last lengths[i] tokens.":
                [sum(x for x in lp if x is not None) for lp in log_probs],
            "the best choice has the LARGEST log-probability (closest to 0), not the smallest.":
                [-total for total in sums]}
        hint = next((words for words, scores in mistakes.items()
                     if int(got) == max(range(len(scores)), key=scores.__getitem__)),
                    "for each choice sum the last lengths[i] log-probabilities, then return the index of the largest.")
        fail(CHOICE, f"choice {want}", f"choice {got}", f"{hint} Case: {about}")
    passed(CHOICE, "An evaluation harness scores a model through any server this way (labsupport.lab.http_serving_quality).")
