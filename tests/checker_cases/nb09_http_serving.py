"""Checker cases of notebook 09 (serving over HTTP): the reference and each typical mistake."""

import json

from labsupport.checks.http_serving import check_best_choice, check_held_back, check_parse_sse, reference_parse_sse
from labsupport.lab.http_serving_quality import best_choice
from labsupport.serve.text import held_back

from checker_cases.common import accepts, refuses


# --- reading a stream of server-sent events ---------------------------------------------------

def never_stops(body):
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def keeps_text(body):
    return [line[6:] for line in body.splitlines() if line.startswith("data: {")]


def takes_comments(body):
    chunks = reference_parse_sse(body)
    return chunks + [{}] * body.count(": ping")


def crashes_on_done(body):
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


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


NOTEBOOK_09 = [
    accepts(check_parse_sse, "reference", reference_parse_sse),
    refuses(check_parse_sse, "reads past [DONE]", "stop at", never_stops),
    refuses(check_parse_sse, "returns the JSON text", "json.loads", keeps_text),
    refuses(check_parse_sse, "counts comments", "comments", takes_comments),
    refuses(check_parse_sse, "parses [DONE] as JSON", "DONE", crashes_on_done),
    accepts(check_held_back, "by hand", held_by_hand),
    refuses(check_held_back, "whole stop strings only", "BEGINNING", whole_stops_only),
    refuses(check_held_back, "the first stop string only", "BEGINNING", first_stop_only),
    refuses(check_held_back, "the shortest ending", "longest", shortest),
    refuses(check_held_back, "any letter of a stop string", "starts with", any_letter),
    refuses(check_held_back, "the package's own held_back", "yourself", held_back),
    accepts(check_best_choice, "by hand", by_hand),
    refuses(check_best_choice, "the mean", "mean", by_mean),
    refuses(check_best_choice, "one token short", "the first too", all_but_first_choice_token),
    refuses(check_best_choice, "the question's tokens summed too", "question", with_the_question),
    refuses(check_best_choice, "the None summed", "None", whole_list),
    refuses(check_best_choice, "the least likely", "LARGEST", least_likely),
    refuses(check_best_choice, "the score, not the index", "index", the_score),
    refuses(check_best_choice, "the package's best_choice", "yourself", calls_the_package),
    refuses(check_best_choice, "the package's best_choice itself", "yourself", best_choice),
]
