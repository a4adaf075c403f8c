"""Checker cases of notebook 09 (serving over HTTP): the reference and each typical mistake."""

import importlib
import json

from labsupport.checks import http_serving
from labsupport.checks.http_serving import (check_best_choice, check_cache_hits, check_held_back, check_parse_sse,
                                            reference_parse_sse, served_cache_hits)
from labsupport.engine.serving.block_manager import BlockManager
from labsupport.lab import http_serving_loadgen
from labsupport.lab.http_serving_quality import best_choice, choice_accuracy
from labsupport.serve.text import StopMatcher, TextStream, held_back

from checker_cases.common import accepts, refuses

OWN = "expected your own code"

# (grade id -> {mutant: why no valid input tells it from the notebook's solution}); scripts/checker_mutants.py
EQUIVALENT_MUTANTS = {
    "http-parse-sse": {
        "9:38:slice:lower-1": "line[5:] keeps the space after 'data:', and json.loads skips leading whitespace: "
                              "every chunk parses to the same dict",
    },
    "http-held-back": {
        "5:23:constant:1-1": "k = 0 tests text.endswith(''), always true, and max(longest, 0) leaves longest as it is",
        "7:26:swap-arguments:0<->1": "max(k, longest) is max(longest, k): ints, the same value either way",
    },
    "http-cache-hits": {
        "8:22:swap-arguments:0<->1": "min(len(prompt) - 1, len(earlier)) is min(len(earlier), len(prompt) - 1)",
        "10:22:swap-arguments:0<->1": "max(n, longest) is max(longest, n): ints, the same value either way",
    },
}


# --- reading a stream of server-sent events ---------------------------------------------------

def parse_by_hand(body):                                            # the notebook's solution
    chunks = []
    for line in body.splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        chunks.append(json.loads(line[len("data: "):]))
    return chunks

def never_stops(body):
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def keeps_text(body):
    return [line[6:] for line in body.splitlines() if line.startswith("data: {")]


def takes_comments(body):
    chunks = parse_by_hand(body)
    return chunks + [{}] * body.count(": ping")


def crashes_on_done(body):
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def parse_by_default(body, _reader=reference_parse_sse):
    return _reader(body)


def _closure_over_the_loadgen():
    chunk_of = http_serving_loadgen._parse_chunk                     # the load generator's reader of one event

    def parse(body):
        chunks = []
        for line in body.splitlines():
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                chunks.append(chunk_of(line[6:]))
        return chunks
    return parse


def _events(body):
    return http_serving.reference_parse_sse(body)


def parse_by_a_helper(body):
    return _events(body)


def parse_by_a_built_name(body):
    module = importlib.import_module("labsupport.checks.http_serving")
    return getattr(module, "reference_" + "parse_sse")(body)


# --- the text held back for stop strings -------------------------------------------------------

def whole_stops_only(text, stops):
    return max((len(s) for s in stops if text.endswith(s)), default=0)


def held_by_hand(text, stops):
    longest = 0
    for stop in stops:
        for k in range(1, len(stop)):
            if text.endswith(stop[:k]):
                longest = max(longest, k)
    return longest


def first_stop_only(text, stops):
    return held_by_hand(text, stops[:1])


def shortest(text, stops):
    return min((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def first_match_wins(text, stops):
    for stop in stops:
        for k in range(len(stop) - 1, 0, -1):
            if text.endswith(stop[:k]):
                return k
    return 0


def last_match_wins(text, stops):
    longest = 0
    for stop in stops:
        for k in range(1, len(stop)):
            if text.endswith(stop[:k]):
                longest = k                                       # not max(longest, k)
    return longest


def whole_stop_too(text, stops):
    return max((k for s in stops for k in range(1, len(s) + 1) if text.endswith(s[:k])), default=0)


def held_by_default(text, stops, _held=held_back):
    return _held(text, stops)


def _closure_over_the_matcher():
    matcher = StopMatcher

    def held(text, stops):
        longest = 0
        for stop in stops:
            state, automaton = 0, matcher(stop)
            for char in text[-len(stop) + 1:] if len(stop) > 1 else "":
                state = automaton.step(state, char)
            longest = max(longest, state if state < len(stop) else 0)
        return longest
    return held


def _stream_of(stops):
    return TextStream(None, stops)


def held_by_a_helper(text, stops):
    return held_by_hand(text, stops) if _stream_of(stops) else 0


def held_by_a_built_name(text, stops):
    return getattr(importlib.import_module("labsupport.serve.text"), "held" + "_back")(text, stops)


def any_letter(text, stops):
    return max((len(text) - i for s in stops for i in range(len(text)) if text[i] in s), default=0)


# --- a multiple-choice answer from prompt log-probabilities -----------------------------------

def by_hand(log_probs, lengths):
    scores = [sum(lp[-n:]) for lp, n in zip(log_probs, lengths)]
    return scores.index(max(scores))


def by_mean(log_probs, lengths):
    scores = [sum(lp[-n:]) / n for lp, n in zip(log_probs, lengths)]
    return scores.index(max(scores))


def all_but_first_choice_token(log_probs, lengths):
    scores = [sum(lp[len(lp) - n + 1:]) for lp, n in zip(log_probs, lengths)]
    return scores.index(max(scores))


def with_the_question(log_probs, lengths):
    scores = [sum(x for x in lp if x is not None) for lp in log_probs]
    return scores.index(max(scores))


def whole_list(log_probs, lengths):
    scores = [sum(lp) for lp in log_probs]                  # the leading None: a TypeError
    return scores.index(max(scores))


def least_likely(log_probs, lengths):
    scores = [sum(lp[-n:]) for lp, n in zip(log_probs, lengths)]
    return scores.index(min(scores))


def the_score(log_probs, lengths):
    return max(sum(lp[-n:]) for lp, n in zip(log_probs, lengths))


def calls_the_package(log_probs, lengths):
    from labsupport.lab import http_serving_quality
    return http_serving_quality.best_choice(log_probs, lengths)


def choice_by_default(log_probs, lengths, _best=best_choice):
    return _best(log_probs, lengths)


def _closure_over_the_accuracy():
    accuracy = choice_accuracy

    def pick(log_probs, lengths):
        return by_hand(log_probs, lengths) if accuracy else 0
    return pick


def _sums(log_probs, lengths):
    from labsupport.lab.http_serving_quality import best_choice as package_best
    return package_best(log_probs, lengths)


def choice_by_a_helper(log_probs, lengths):
    return _sums(log_probs, lengths)


def choice_by_a_built_name(log_probs, lengths):
    module = importlib.import_module("labsupport.lab.http_serving_quality")
    return getattr(module, "best" + "_choice")(log_probs, lengths)


# --- the prompt positions found in the prefix cache -------------------------------------------

def _shared(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def hits_by_hand(prompts, block_size):
    hits = []
    for i, prompt in enumerate(prompts):
        longest = max((min(_shared(earlier, prompt), len(prompt) - 1) for earlier in prompts[:i]), default=0)
        hits.append(longest // block_size * block_size)
    return hits


def partial_blocks(prompts, block_size):
    return [max((min(_shared(q, p), len(p) - 1) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


def the_last_token_too(prompts, block_size):
    return [max((_shared(q, p) for q in prompts[:i]), default=0) // block_size * block_size
            for i, p in enumerate(prompts)]


def the_previous_prompt_only(prompts, block_size):
    return [min(_shared(prompts[i - 1], p), len(p) - 1) // block_size * block_size if i else 0
            for i, p in enumerate(prompts)]


def blocks_anywhere(prompts, block_size):
    return [sum(block_size for k in range(0, (len(p) - 1) // block_size * block_size, block_size)
                if any(q[k:k + block_size] == p[k:k + block_size] for q in prompts[:i]))
            for i, p in enumerate(prompts)]


def rounded_up(prompts, block_size):
    return [-(-n // block_size) * block_size for n in partial_blocks(prompts, block_size)]


def one_per_prompt(prompts, block_size):
    return sum(hits_by_hand(prompts, block_size))


def by_the_block_manager(prompts, block_size):
    manager = BlockManager(64, block_size, prefix_caching=True)
    hits = []
    for index, prompt in enumerate(prompts):
        hits.append(len(manager.cached_prefix(prompt)) * block_size)
        manager.admit(index, prompt, len(prompt))
        manager.cache_full_blocks(index, prompt, len(prompt))
    return hits


NOTEBOOK_09 = [
    accepts(check_parse_sse, "by hand", parse_by_hand),
    refuses(check_parse_sse, "reads past [DONE]", "stop at", never_stops),
    refuses(check_parse_sse, "returns the JSON text", "json.loads", keeps_text),
    refuses(check_parse_sse, "counts comments", "are comments .keep-alives.", takes_comments),
    refuses(check_parse_sse, "parses [DONE] as JSON", "DONE", crashes_on_done),
    refuses(check_parse_sse, "the checker's reference_parse_sse", OWN + ".*reference_parse_sse", reference_parse_sse),
    refuses(check_parse_sse, "the checker's reader as a default", OWN, parse_by_default),
    refuses(check_parse_sse, "the load generator's chunk reader in a closure", OWN + ".*_parse_chunk",
            _closure_over_the_loadgen()),
    refuses(check_parse_sse, "the checker's reader through a helper", OWN, parse_by_a_helper),
    refuses(check_parse_sse, "the checker's reader by a built name", OWN, parse_by_a_built_name),
    accepts(check_held_back, "by hand", held_by_hand),
    refuses(check_held_back, "whole stop strings only", "BEGINNING", whole_stops_only),
    refuses(check_held_back, "the first stop string only", "BEGINNING", first_stop_only),
    refuses(check_held_back, "the shortest ending", "longest", shortest),
    refuses(check_held_back, "the first matching stop string wins", "first matching stop string's ending",
            first_match_wins),
    refuses(check_held_back, "the last matching stop string wins", "last matching stop string's ending",
            last_match_wins),
    refuses(check_held_back, "a whole stop string held back", "not held back", whole_stop_too),
    refuses(check_held_back, "any letter of a stop string", "starts with", any_letter),
    refuses(check_held_back, "the package's own held_back", OWN + ".*held_back", held_back),
    refuses(check_held_back, "the package's held_back as a default", OWN, held_by_default),
    refuses(check_held_back, "the server's StopMatcher in a closure", OWN + ".*StopMatcher",
            _closure_over_the_matcher()),
    refuses(check_held_back, "the server's TextStream through a helper", OWN + ".*TextStream", held_by_a_helper),
    refuses(check_held_back, "the package's held_back by a built name", OWN, held_by_a_built_name),
    accepts(check_best_choice, "by hand", by_hand),
    refuses(check_best_choice, "the mean", "mean", by_mean),
    refuses(check_best_choice, "one token short", "the first too", all_but_first_choice_token),
    refuses(check_best_choice, "the question's tokens summed too", "question", with_the_question),
    refuses(check_best_choice, "the None summed", "None", whole_list),
    refuses(check_best_choice, "the least likely", "LARGEST", least_likely),
    refuses(check_best_choice, "the score, not the index", "index", the_score),
    refuses(check_best_choice, "the package's best_choice", OWN, calls_the_package),
    refuses(check_best_choice, "the package's best_choice itself", OWN, best_choice),
    refuses(check_best_choice, "the package's best_choice as a default", OWN, choice_by_default),
    refuses(check_best_choice, "the package's choice_accuracy in a closure", OWN + ".*choice_accuracy",
            _closure_over_the_accuracy()),
    refuses(check_best_choice, "the package's best_choice through a helper", OWN, choice_by_a_helper),
    refuses(check_best_choice, "the package's best_choice by a built name", OWN, choice_by_a_built_name),
    accepts(check_cache_hits, "by hand", hits_by_hand),
    refuses(check_cache_hits, "partial blocks counted", "only whole blocks", partial_blocks),
    refuses(check_cache_hits, "the last token served from the cache", "last token is always computed",
            the_last_token_too),
    refuses(check_cache_hits, "the previous prompt only", "not only the previous one", the_previous_prompt_only),
    refuses(check_cache_hits, "matching blocks anywhere", "every block before it matched", blocks_anywhere),
    refuses(check_cache_hits, "blocks rounded up", "whole blocks of the longest prefix", rounded_up),
    refuses(check_cache_hits, "one number for all prompts", "one number of positions per prompt", one_per_prompt),
    refuses(check_cache_hits, "the checker's engine run", OWN + ".*served_cache_hits", served_cache_hits),
    refuses(check_cache_hits, "the engine's BlockManager", OWN + ".*cached_prefix", by_the_block_manager),
]
