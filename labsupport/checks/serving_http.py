"""Checkers for notebook 09 (serving over HTTP): reading a stream of server-sent events, and the
text a server must hold back while it may still be the start of a stop string. Each compares a
learner's function with the reference and prints a short confirmation or raises `CheckFailed`.
"""

from __future__ import annotations

import json

from ..serve.text import held_back
from . import call_learner, fail, grades_quietly, passed

SSE = "reading a stream of server-sent events"
HOLD = "the text held back for stop strings"


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


@grades_quietly
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
        if got != want:
            hint = ("stop at `data: [DONE]`: it ends the stream." if len(got) > len(want) else
                    "every `data: {...}` line before [DONE] is one chunk; lines that start with ':' are comments.")
            fail(SSE, f"{len(want)} chunks", f"{len(got)} chunks", f"{hint} Case: {about}")
    passed(SSE, "The load generator reads every server's stream this way (labsupport.lab.loadgen).")


def _hold_cases() -> list[tuple[str, list[str], str]]:
    return [("Hello wor", ["world"], "the text ends with the first three letters of the stop string"),
            ("Hello", ["\n\n"], "no ending starts the stop string"),
            ("The end.\n", ["\n\n", "END"], "the ending '\\n' starts the first stop string"),
            ("abcab", ["abcd"], "the ending 'ab' starts the stop string, though the text began with more of it"),
            ("I said E", ["\n\n", "END"], "the second stop string's start"),
            ("xxEN", ["ENOUGH", "END"], "two stop strings start with the same ending"),
            ("aaaa", ["aaab"], "endings of several lengths start it: the longest is 3"),
            ("", ["stop"], "no text yet"),
            ("tops", ["stop"], "the stop string's letters in another order"),
            ("Hi", [], "no stop strings")]


@grades_quietly
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
        if got == want:
            continue
        if got < want:
            hint = ("an ending that is only the BEGINNING of a stop string must wait too; test every length k "
                    "from 1 to len(stop) - 1, and keep the longest.")
        else:
            hint = ("hold back only an ending that a stop string starts with (text.endswith(stop[:k])), "
                    "and never the whole text for nothing.")
        fail(HOLD, str(want), str(got), f"{hint} Case: text {text!r}, stops {stops} ({about})")
    passed(HOLD, "The server sends everything before the held-back ending, token by token.")
