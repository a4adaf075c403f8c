"""Checker cases of notebook 09 (serving over HTTP): the reference and each typical mistake."""

import json

from labsupport.checks.serving_http import check_held_back, check_parse_sse, reference_parse_sse
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


def first_stop_only(text, stops):
    return held_back(text, stops[:1])


def shortest(text, stops):
    return min((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def any_letter(text, stops):
    return max((len(text) - i for s in stops for i in range(len(text)) if text[i] in s), default=0)


NOTEBOOK_09 = [
    accepts(check_parse_sse, "reference", reference_parse_sse),
    refuses(check_parse_sse, "reads past [DONE]", "stop at", never_stops),
    refuses(check_parse_sse, "returns the JSON text", "json.loads", keeps_text),
    refuses(check_parse_sse, "counts comments", "comments", takes_comments),
    refuses(check_parse_sse, "parses [DONE] as JSON", "DONE", crashes_on_done),
    accepts(check_held_back, "reference", held_back),
    refuses(check_held_back, "whole stop strings only", "BEGINNING", whole_stops_only),
    refuses(check_held_back, "the first stop string only", "BEGINNING", first_stop_only),
    refuses(check_held_back, "the shortest ending", "longest", shortest),
    refuses(check_held_back, "any letter of a stop string", "starts with", any_letter),
]
