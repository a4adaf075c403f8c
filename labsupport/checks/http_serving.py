"""Checkers for notebook 09 (serving over HTTP): reading a stream of server-sent events, the
text a server must hold back while it may still be the start of a stop string, the answer to
a multiple-choice question from the prompt log-probabilities a server echoes, and the prompt
positions an agent's requests find in the prefix cache. Each compares a learner's function with
the reference (for the cache, what the serving engine itself does) and prints a short confirmation
or raises `CheckFailed`; the learner's code is graded by what it reaches (`labsupport.checks.grading`).
"""

from __future__ import annotations

import functools
import json

from ..engine.serving.engine import Engine
from ..engine.serving.request import Request
from ..lab.http_serving_quality import best_choice
from ..serve.text import held_back
from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded
from ..weights.fixtures import random_model

SSE = "reading a stream of server-sent events"
HOLD = "the text held back for stop strings"
CHOICE = "a multiple-choice answer from prompt log-probabilities"

SSE_EXERCISE = Exercise(title=SSE, teaches="the chunks of a stream of server-sent events, each data line's JSON up "
                                           "to data: [DONE]")
HOLD_EXERCISE = Exercise(title=HOLD, teaches="the length of the longest ending of a text that begins a stop string")
HITS = "the prompt positions found in the prefix cache"
HITS_EXERCISE = Exercise(title=HITS, teaches="the positions of each prompt the prefix cache serves: whole blocks of the "
                                             "longest prefix shared with an earlier prompt, the last token left out",
                         computed_by=("labsupport.engine.serving.prefix_cache.PrefixCache.lookup",
                                      "labsupport.engine.serving.block_manager.BlockManager.cached_prefix",
                                      "labsupport.engine.serving.block_manager.BlockManager.admit",
                                      "labsupport.engine.serving.block_manager.BlockManager.admit_cost",
                                      "labsupport.engine.serving.engine.Engine.step"))
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


@functools.cache
def _tiny_model():
    return random_model("tiny-llama")       # what its weights are does not matter: only which blocks are cached


def served_cache_hits(prompts: list[list[int]], block_size: int) -> list[int]:
    """The prompt positions the serving engine (prefix caching on, one slot, a pool that evicts
    nothing) takes from its prefix cache for each of `prompts`, sent one after another, each
    answered (one token) before the next comes. The measured answer the checker grades against.
    Introduced in notebook 09 (serving over HTTP)."""
    engine = Engine(_tiny_model(), max_slots=1, block_size=block_size, prefix_caching=True, record=False,
                    cache_tokens=block_size * (sum(len(p) // block_size + 2 for p in prompts)))
    hits = []
    for prompt in prompts:
        before = engine.prefix_hit_tokens
        engine.add_request(Request(list(prompt), max_new_tokens=1))
        while engine.has_work:
            engine.step()
        hits.append(engine.prefix_hit_tokens - before)
    return hits


def _hits_cases() -> list[tuple[list[list[int]], int, str]]:
    """(prompts in the order they are sent, block size, what the case tests); token ids of the tiny model's 260."""
    system = list(range(10, 31))                                          # 21 tokens every conversation starts with
    turn1 = system + [40, 41, 42]
    turn2 = turn1 + [50, 51, 52, 53, 54, 55] + [60, 61, 62, 63, 64]           # the answer, then a new question
    turn3 = turn2 + [70, 71, 72, 73] + [80, 81, 82, 83, 84, 85, 86]
    other = system + [90, 91, 92, 93, 94, 95, 96, 97]
    return [([turn1, turn2, turn3], 4, "one conversation, turn after turn"),
            ([turn1, turn2, turn3], 16, "the same conversation in blocks of 16"),
            ([turn2, list(turn2)], 4, "a retry: the same prompt twice"),
            ([list(range(10, 34)), list(range(10, 34))], 4, "a retry of a prompt that fills its blocks exactly"),
            ([turn1, other], 4, "two conversations with the same system prompt"),
            ([turn2, other, turn3], 4, "the third prompt shares more with the first than with the second"),
            ([turn2, [5] + turn2[1:]], 4, "a prompt that differs from an earlier one in its first token only"),
            ([turn3, turn1], 4, "a shorter prompt that begins an earlier one"),
            ([turn1 + [43], turn1 + [43]], 4, "a retry whose last block holds one token"),
            ([turn1, turn2, turn2[:9] + [7] + turn2[10:]], 1, "blocks of one position: every shared token counts")]


def _hits_mistakes(prompts: list[list[int]], block_size: int) -> dict[str, list[int]]:
    """What each typical slip predicts, and the hint that names it."""
    def shared(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def each(limit, rounding, earlier=lambda i: prompts[:i]):
        return [rounding(max((limit(p, shared(q, p)) for q in earlier(i)), default=0)) for i, p in enumerate(prompts)]

    whole = lambda n: n // block_size * block_size                                        # noqa: E731
    upto_last = lambda p, n: min(n, len(p) - 1)                                           # noqa: E731
    return {
        "only whole blocks are shared: round the shared prefix down to a multiple of block_size.":
            each(upto_last, lambda n: n),
        "a prompt served wholly from the cache would have no logits for its next token: the last token is always "
        "computed, so share at most len(prompt) - 1 positions.": each(lambda p, n: n, whole),
        "every earlier prompt's blocks stay in the cache, not only the previous one's: take the longest over all.":
            each(upto_last, whole, earlier=lambda i: prompts[max(i - 1, 0):i]),
        "a block is found only when every block before it matched too (each block's hash includes its parent's).":
            [sum(block_size for k in range(0, (len(p) - 1) // block_size * block_size, block_size)
                 if any(q[k:k + block_size] == p[k:k + block_size] for q in prompts[:i]))
             for i, p in enumerate(prompts)]}


@grades_quietly
@graded(HITS_EXERCISE)
def check_cache_hits(fn) -> None:
    """Check `fn(prompts, block_size) -> list of ints`: for each prompt, sent one after another to a
    server with prefix caching, the positions its prefix cache serves, against what the serving
    engine does on the same prompts. Introduced in notebook 09 (serving over HTTP)."""
    for prompts, block_size, about in _hits_cases():
        want = served_cache_hits(prompts, block_size)
        got = call_learner(HITS, str(want), "for each prompt compare it with every earlier one, token by token.",
                           fn, [list(p) for p in prompts], block_size)
        if not isinstance(got, (list, tuple)) or len(got) != len(prompts) or \
                not all(isinstance(n, int) and not isinstance(n, bool) for n in got):
            fail(HITS, f"a list of {len(prompts)} ints", repr(got)[:80], "return one number of positions per prompt.")
        if list(got) == want:
            continue
        hint = next((words for words, slip in _hits_mistakes(prompts, block_size).items() if list(got) == slip),
                    "the cache serves whole blocks of the longest prefix a prompt shares with any earlier prompt, "
                    "leaving its last token to compute.")
        fail(HITS, str(want), str(list(got)), f"{hint} Case: {about} (blocks of {block_size})")
    passed(HITS, "The serving engine's BlockManager finds them this way, block by block (notebook 06b).")
