"""Quality through the server: perplexity and a multiple-choice score from the prompt's
log-probabilities, as evaluation harnesses take them, equal to the same scores in process.

Introduced in notebook 09 (serving over HTTP). An evaluation harness (lm-evaluation-harness's
``local-completions``) never sees a model: it sends ``/v1/completions`` with ``echo: true``,
``logprobs``, ``max_tokens: 0`` and several prompts per request, and reads back the log-
probability the model gave each prompt token after the ones before it (the first token's is
null: nothing precedes it). From those alone:

* perplexity = exp(-mean log-probability of every token after the first);
* a multiple-choice answer = the choice whose tokens, after the question's, have the largest
  summed log-probability (lm-eval's ``acc``).

`in_process_log_probs` computes the same numbers from one forward pass (`quality.logits_of`),
so a served score can be checked against the model's own: a server that drops a token, shifts
the positions by one or applies a temperature to the log-probabilities fails the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import LabError
from .quality import logits_of


@dataclass(frozen=True)
class ChoiceQuestion:
    """One multiple-choice item: the question's text, its choices (each the continuation that
    would follow the question) and the index of the right one. Notebook 09."""

    question: str
    choices: tuple[str, ...]
    answer: int


# a small set a 135M model gets partly right: the point is the same score served and in process
CHOICE_QUESTIONS = (
    ChoiceQuestion("The capital of France is", (" Paris", " Berlin", " Madrid", " Rome"), 0),
    ChoiceQuestion("Water freezes at a temperature of", (" zero degrees Celsius", " fifty degrees Celsius",
                                                         " two hundred degrees Celsius"), 0),
    ChoiceQuestion("The largest planet in our solar system is", (" Mercury", " Jupiter", " Mars", " Venus"), 1),
    ChoiceQuestion("A week has", (" three days", " seven days", " twelve days"), 1),
    ChoiceQuestion("The opposite of hot is", (" cold", " loud", " tall", " green"), 0),
    ChoiceQuestion("Bees make", (" honey", " steel", " glass"), 0),
    ChoiceQuestion("The sun rises in the", (" east", " north", " basement"), 0),
    ChoiceQuestion("Two plus two equals", (" four", " nine", " eleven"), 0),
    ChoiceQuestion("Ice is the solid form of", (" water", " iron", " sand"), 0),
    ChoiceQuestion("A cat is a kind of", (" animal", " vegetable", " mineral"), 0),
    ChoiceQuestion("People read books in a", (" library", " volcano", " swimming pool"), 0),
    ChoiceQuestion("The color of a clear daytime sky is", (" blue", " purple", " black"), 0),
)


def served_log_probs(url: str, model: str, prompts: list[list[int]], timeout: float = 300.0,
                     headers: dict | None = None) -> list[list[float | None]]:
    """Each prompt's token log-probabilities as the server at `url` gives them (one
    ``/v1/completions`` request: the prompts as token ids, ``echo``, ``logprobs: 1``,
    ``max_tokens: 0``); the first of each is None. A reply that is not that shape is one
    sentence (a LabError). Notebook 09 (serving over HTTP)."""
    import httpx

    if not prompts or any(len(p) < 1 for p in prompts):
        raise LabError("served_log_probs needs at least one prompt of at least one token.")
    body = {"model": model, "prompt": [list(map(int, p)) for p in prompts], "echo": True, "logprobs": 1,
            "max_tokens": 0, "temperature": 0}
    reply = httpx.post(url.rstrip("/") + "/v1/completions", json=body, timeout=timeout, headers=headers)
    if reply.status_code != 200:
        try:
            why = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = reply.text[:200]
        raise LabError(f"The server answered {reply.status_code} to an echo + logprobs request ({why}).")
    choices = sorted(reply.json().get("choices", []), key=lambda c: c["index"])
    out = [(c.get("logprobs") or {}).get("token_logprobs") for c in choices]
    if len(out) != len(prompts) or any(lp is None or len(lp) != len(p) for lp, p in zip(out, prompts)):
        raise LabError("The server's echo + logprobs reply does not give one log-probability per prompt token; "
                       "it cannot score a model.")
    return out


def in_process_log_probs(model, ids: list[int]) -> list[float | None]:
    """The same numbers from the model itself: log p(token t | tokens before t), the first None.
    Notebook 09 (serving over HTTP)."""
    logits = logits_of(model, ids)                                            # (T, vocab)
    log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)                # (T - 1, vocab)
    chosen = log_probs.gather(1, torch.as_tensor(ids[1:], device=logits.device).reshape(-1, 1))  # (T - 1, 1)
    return [None] + chosen.reshape(-1).tolist()


def perplexity_from_log_probs(log_probs: list[float | None]) -> float:
    """exp(-mean) of every log-probability after the first (None). Notebook 09."""
    scored = [lp for lp in log_probs[1:] if lp is not None]
    if not scored:
        raise LabError("Perplexity needs at least two tokens.")
    return math.exp(-sum(scored) / len(scored))


def choice_prompts(tokenizer, questions=CHOICE_QUESTIONS) -> list[tuple[list[int], int]]:
    """For each choice of each question: (question + choice as token ids, how many of them are
    the choice's). Question and choice are tokenized apart, as lm-eval does. Notebook 09."""
    out = []
    for q in questions:
        context = tokenizer.encode(q.question, add_special_tokens=False)
        for choice in q.choices:
            tail = tokenizer.encode(choice, add_special_tokens=False)
            out.append((context + tail, len(tail)))
    return out


def best_choice(log_probs: list[list[float | None]], lengths: list[int]) -> int:
    """The index of the choice whose own tokens (the last lengths[i] of log_probs[i], question
    + choice as the server echoed them) have the largest summed log-probability: lm-eval's
    ``acc``. The question's tokens are left out: they are the same for every choice. Notebook 09."""
    scores = [sum(lp[len(lp) - n:]) for lp, n in zip(log_probs, lengths)]
    return max(range(len(scores)), key=scores.__getitem__)


def choice_accuracy(log_probs: list[list[float | None]], prompts: list[tuple[list[int], int]],
                    questions=CHOICE_QUESTIONS) -> float:
    """The fraction of questions whose right choice is the `best_choice` (`choice_prompts`'
    order). Notebook 09 (serving over HTTP)."""
    right, at = 0, 0
    for q in questions:
        mine = slice(at, at + len(q.choices))
        right += best_choice(log_probs[mine], [n for _, n in prompts[mine]]) == q.answer
        at += len(q.choices)
    return right / len(questions)


def quality_row(name: str, url: str, served_name: str, model, tokenizer, eval_ids: list[int]) -> dict:
    """Perplexity on `eval_ids` and the multiple-choice accuracy, through the server at `url`
    and in process on `model` (the model that server serves), with the largest difference of
    any log-probability between the two. Notebook 09 (serving over HTTP)."""
    prompts = choice_prompts(tokenizer)
    served = served_log_probs(url, served_name, [eval_ids] + [ids for ids, _ in prompts])
    local = [in_process_log_probs(model, eval_ids)] + [in_process_log_probs(model, ids) for ids, _ in prompts]
    gap = max(abs(a - b) for s, l in zip(served, local) for a, b in zip(s[1:], l[1:]))
    return {"server": name, "tokens": len(eval_ids),
            "served_perplexity": perplexity_from_log_probs(served[0]),
            "in_process_perplexity": perplexity_from_log_probs(local[0]),
            "served_choice_accuracy": choice_accuracy(served[1:], prompts),
            "in_process_choice_accuracy": choice_accuracy(local[1:], prompts),
            "questions": len(CHOICE_QUESTIONS), "largest_log_prob_difference": gap}
