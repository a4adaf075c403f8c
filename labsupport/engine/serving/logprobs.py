"""Log-probabilities of the tokens a request is served, and of its prompt's tokens.

Introduced in notebook 09 (serving over HTTP): what an OpenAI-compatible server returns for
`logprobs` (and, with `echo`, for the prompt), and what evaluation harnesses score with.

A log-probability here is the MODEL's own: log_softmax of its logits in float32 at that
step, before temperature, top-k or top-p (vLLM's default, "raw" log-probabilities), so that
the figure says what the model thinks of a token whatever sampling picked it. The engine
computes it in the step where the logits already are, only for the requests that ask
(`Request.logprobs` not None): the others pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP = 20          # the most alternatives per position (vLLM's default max_logprobs)


@dataclass
class TokenLogprobs:
    """One position: the token there, its log-probability, and the `top` most likely tokens
    as (token id, log-probability), most likely first. Notebook 09 (serving over HTTP)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def logprobs_at(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprobs]:
    """The log-probability of tokens[i] under logits[i] and the `top` best tokens there.
    logits: (N, vocab), any dtype (read in float32). Notebook 09 (serving over HTTP)."""
    logp = logits.float().log_softmax(dim=-1)                                       # (N, vocab)
    ids = torch.tensor(tokens, dtype=torch.long, device=logits.device)[:, None]     # (N, 1)
    chosen = logp.gather(-1, ids)[:, 0].tolist()                                    # (N,)
    best_values, best_ids = logp.topk(top, dim=-1) if top else (logp[:, :0], logp[:, :0].long())   # (N, top)
    pairs = [list(zip(i, v)) for i, v in zip(best_ids.tolist(), best_values.tolist())]
    return [TokenLogprobs(t, c, p) for t, c, p in zip(tokens, chosen, pairs)]


def record_logprobs(logits: torch.Tensor, rows: list[int], events: list) -> None:
    """After a step's sampling: append to each asking sequence's `logprobs` the entry of the
    token it was just given. rows[i]: the row of logits that gave events[i] = (sequence, token).
    One float32 log_softmax over the asking rows only. Notebook 09 (serving over HTTP)."""
    asked = [(row, seq, token) for row, (seq, token) in zip(rows, events) if seq.request.logprobs is not None]
    if not asked:
        return
    top = max(seq.request.logprobs for _, seq, _ in asked)
    picked = logits[torch.tensor([row for row, _, _ in asked], device=logits.device)]   # (A, vocab)
    for (_, seq, _), entry in zip(asked, logprobs_at(picked, [token for _, _, token in asked], top)):
        entry.top = entry.top[: seq.request.logprobs]
        seq.logprobs.append(entry)


@torch.inference_mode()
def prompt_logprobs(model, prompt: list[int], top: int, chunk: int = 256) -> list[TokenLogprobs | None]:
    """Every prompt token's log-probability given the tokens before it, from one forward pass
    over the whole prompt (no cache); the first token has none (None), as the OpenAI API
    shapes `echo`. The vocabulary projection runs `chunk` positions at a time, so that a long
    prompt never holds all (T, vocab) logits at once. Notebook 09 (serving over HTTP)."""
    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)            # (1, T)
    hidden = model(ids)                                                             # (1, T, hidden)
    out: list[TokenLogprobs | None] = [None]
    for start in range(0, len(prompt) - 1, chunk):
        positions = torch.arange(start, min(start + chunk, len(prompt) - 1), device=model.device)   # (n,)
        logits = model.logits(hidden, at=positions)[0]                              # (n, vocab)
        out += logprobs_at(logits, prompt[start + 1: start + 1 + len(positions)], top)
    return out
