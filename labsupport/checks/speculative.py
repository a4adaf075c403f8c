"""Checkers for notebook 05 (speculative decoding): the accept/reject step, the expected
tokens per pass, and one greedy speculative step with its bonus token and cache rollback.

Introduced in notebook 05 (speculative decoding). Each checker runs the learner's function on inputs
chosen so that every typical mistake gives a different answer from the right one; when an answer matches
a known mistake on all of them, the hint names that mistake. All three are deterministic: u is an argument,
the resampling step is checked through the distribution it would sample from, the step runs greedy.
"""

from __future__ import annotations

import math

import torch

from ..engine.kv_cache import StaticKVCache
from ..weights.fixtures import lively_model
from ..engine.speculative import PromptLookupDraft
from ..lab.speculative_math import expected_tokens_per_call, expected_tokens_per_pass
from . import close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded
from .kv_cache import CountingModel

ACCEPT = "the accept/reject-and-resample step"
EXPECTED = "expected tokens per target pass"
STEP = "one greedy speculative step"
VERIFY, MODELS = "labsupport.engine.speculative.verify", "labsupport.engine.models.transformer.Transformer"
ACCEPT_STEP = Exercise(ACCEPT, "the acceptance test of speculative sampling, u < min(1, p_target[x] / p_draft[x]), "
                               "and the residual normalize(max(0, p_target - p_draft)) a rejected token is drawn "
                               "again from", computed_by=(VERIFY,))
EXPECTED_TOKENS = Exercise(EXPECTED, "the expected tokens of one target pass from one acceptance rate per position, "
                                     "1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 ... alpha_k")   # lab: denied
GREEDY_STEP = Exercise(    # its building blocks: the pass (forward, logits, device) and the rollback (truncate)
    STEP, "one greedy speculative step: one target pass over the pending token and the drafts, the drafts kept up "
          "to the first miss, the target's correction or bonus token, and the cache rolled back",
    computed_by=(VERIFY, "labsupport.engine.speculative.speculative_generate",
                 "labsupport.engine.speculative._speculative_step", "labsupport.engine.speculative._verify_pass"),
    receives=(MODELS, "labsupport.engine.kv_cache.StaticKVCache"),
    allowed=(f"{MODELS}.forward", f"{MODELS}.logits", f"{MODELS}.device", "labsupport.engine.kv_cache.StaticKVCache.truncate"))


# --- warm-up 1: the acceptance rule --------------------------------------------------------

def reference_accept_step(p_target: torch.Tensor, p_draft: torch.Tensor | None, token: int,
                          u: float) -> tuple[bool, torch.Tensor | None]:
    """Accept `token` if u < min(1, p_t[x] / p_d[x]); otherwise return the residual
    normalize(max(0, p_t - p_d)) that the replacement token is drawn from. p_draft None: a
    draft that proposes its token with certainty (prompt lookup), q one-hot at `token`.
    Notebook 05 (speculative decoding)."""
    p_draft = _point_mass(p_target, token) if p_draft is None else p_draft
    ratio = float(p_target[token]) / float(p_draft[token])
    if u < min(1.0, ratio):
        return True, None
    residual = (p_target - p_draft).clamp_min(0)
    return False, residual / residual.sum()


def _point_mass(p: torch.Tensor, token: int) -> torch.Tensor:
    """The draft distribution of a draft that proposes `token` with certainty: one-hot."""
    return torch.zeros_like(p).index_fill_(0, torch.tensor([token]), 1.0)


def _rule(accept, residual, point_mass=None):
    """An accept step made of an acceptance test accept(p_x, q_x, u) and a residual(p, q);
    `point_mass(p, x, u)` answers for p_draft None (default: the same rule on a one-hot q)."""
    def step(p, q, x, u):
        if q is None and point_mass is not None:
            return point_mass(p, x, u)
        q = _point_mass(p, x) if q is None else q
        return (True, None) if accept(float(p[x]), float(q[x]), u) else (False, residual(p, q))
    return step


_normalized = lambda r: r / r.sum()                                          # noqa: E731
_RIGHT_TEST = lambda px, qx, u: u < min(1.0, px / qx)                        # noqa: E731
_RIGHT_RESIDUAL = lambda p, q: _normalized((p - q).clamp_min(0))             # noqa: E731
ACCEPT_MISTAKES = {   # the typical wrong answers, each with the hint that names it
    "always accepting": (_rule(lambda px, qx, u: True, _RIGHT_RESIDUAL),
                         "every draft is accepted; accept only when u < min(1, p_target[x] / p_draft[x])."),
    "u against p_target alone": (_rule(lambda px, qx, u: u < px, _RIGHT_RESIDUAL),
                                 "u is compared with p_target[x] alone; compare it with the ratio "
                                 "min(1, p_target[x] / p_draft[x])."),
    "the ratio upside down": (_rule(lambda px, qx, u: u < min(1.0, qx / px), _RIGHT_RESIDUAL),
                              "the ratio is p_target[x] / p_draft[x], not p_draft[x] / p_target[x]."),
    "the test reversed": (_rule(lambda px, qx, u: u >= min(1.0, px / qx), _RIGHT_RESIDUAL),
                          "accept when u is *below* min(1, p_target[x] / p_draft[x]), not above it."),
    "an unnormalized residual": (_rule(_RIGHT_TEST, lambda p, q: (p - q).clamp_min(0)),
                                 "divide max(0, p_target - p_draft) by its sum so that it adds up to 1."),
    "resampling from the target": (_rule(_RIGHT_TEST, lambda p, q: p),
                                   "resampling from p_target itself double-counts the mass the draft already "
                                   "covered; use normalize(max(0, p_target - p_draft))."),
    "the residual reversed": (_rule(_RIGHT_TEST, lambda p, q: _normalized((q - p).clamp_min(0))),
                              "the residual is max(0, p_target - p_draft): where the target wants more than "
                              "the draft gave, not the other way round."),
    "a residual with negative entries": (_rule(_RIGHT_TEST, lambda p, q: (p - q) / (p - q).clamp_min(0).sum()),
                                         "clamp p_target - p_draft at 0 before normalizing: a distribution "
                                         "has no negative entries."),
    "a point mass always accepted": (_rule(_RIGHT_TEST, _RIGHT_RESIDUAL, lambda p, x, u: (True, None)),
                                     "p_draft None means the draft proposed the token with certainty, q is "
                                     "one-hot at it: the test is u < min(1, p_target[x] / 1), not always true."),
    "a point mass's residual still holding its token": (
        _rule(_RIGHT_TEST, _RIGHT_RESIDUAL, lambda p, x, u: (True, None) if u < float(p[x]) else (False, p)),
        "with q one-hot at the drafted token, max(0, p_target - q) is p_target with that token set to 0, "
        "divided by its sum: the rejected token cannot be drawn again."),
}


def _accept_cases() -> tuple[list, list]:
    """(p_target, p_draft, token, u): each mistake above answers at least one of them wrong; then the
    ties, u equal to p/q exactly (0.2 / 0.4 in float32; a point mass's p_target[x]): not below it, rejected."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    cases = [(p, q, 1, 0.25),            # p/q = 1/3: accepted, though u > p_target[x] = 0.2
             (p, q, 1, 0.5), (p, q, 1, 0.9),   # p/q = 1/3: rejected
             (p, q, 0, 0.6),             # p > q: always accepted (u > p_target[x] and > q/p)
             (p, q, 2, 0.999)]           # p == q: always accepted
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        pt = torch.softmax(torch.randn(12, generator=g) * 2, 0)
        pd = torch.softmax(torch.randn(12, generator=g) * 2, 0)
        token = int(torch.argmax(pd / pt))                       # where the draft over-proposes most
        ratio = float(pt[token] / pd[token])
        cases += [(pt, pd, token, ratio * 0.5), (pt, pd, token, min(ratio * 1.5, 0.999))]
    # prompt lookup: no distribution, the token proposed with certainty (p_draft None)
    cases += [(p, None, 1, 0.1), (p, None, 1, 0.5), (p, None, 0, 0.4), (p, None, 3, 0.95)]
    return cases, [(torch.tensor([0.2, 0.3, 0.4, 0.1]), torch.tensor([0.4, 0.2, 0.2, 0.2]), 0, 0.5),
                   (p, None, 1, float(p[1]))]


def _accept_answer(fn, p, q, token, u):
    """(accepted, residual as a float tensor or None), or a CheckFailed for a malformed answer."""
    try:
        got = fn(p.clone(), None if q is None else q.clone(), token, u)
    except (TypeError, AttributeError, IndexError) as error:
        if q is not None:
            raise
        fail(ACCEPT, f"an answer for p_draft None (token {token}, u = {u})", f"{type(error).__name__}: {error}",
             "p_draft is None for a draft that proposes its token with certainty (prompt lookup): what is the "
             "draft's distribution q then, and what do q[token] and max(0, p_target - q) become?")
    try:
        accepted, residual = got
    except (TypeError, ValueError):
        fail(ACCEPT, "a pair (accepted, residual)", repr(got)[:80],
             "return two values, e.g. `return True, None` or `return False, residual`.")
    return bool(accepted), None if residual is None else torch.as_tensor(residual, dtype=torch.float32).flatten()


def _same(a, b) -> bool:
    (ok_a, r_a), (ok_b, r_b) = a, b
    if ok_a != ok_b or ok_a:
        return ok_a == ok_b
    return r_a is not None and r_b is not None and r_a.shape == r_b.shape and bool(torch.allclose(r_a, r_b, atol=1e-5, equal_nan=True))


@grades_quietly
@graded(ACCEPT_STEP)
def check_accept_step(fn) -> None:
    """Check `fn(p_target, p_draft, token, u) -> (accepted, residual)`: residual is the
    normalized distribution to resample from after a rejection, or None when accepted; p_draft
    None stands for a draft that proposed `token` with certainty (prompt lookup: q one-hot).
    Notebook 05 (speculative decoding)."""
    everything, ties = _accept_cases()   # a draft with a distribution first, then the point masses, then ties
    for cases in ([c for c in everything if c[1] is not None], [c for c in everything if c[1] is None], ties):
        _accept_group(fn, cases, named=cases is not ties)
    passed(ACCEPT, "Accepting with min(1, p/q) and resampling from the residual gives exactly p_target; "
                   "for a point mass q is one-hot, so the test is u < p_target[x] and x is left out of the residual.")


def _accept_group(fn, cases, named: bool = True) -> None:
    """Refuse the first case of `cases` where fn differs from the reference, naming (`named`) the
    mistake that answers every one of them as fn does."""
    answers = [_accept_answer(fn, *case) for case in cases]
    wants = [_accept_answer(reference_accept_step, *case) for case in cases]
    wrong = [i for i, (a, w) in enumerate(zip(answers, wants)) if not _same(a, w)]
    if not wrong:
        return
    (p, q, token, u), got, want = cases[wrong[0]], answers[wrong[0]], wants[wrong[0]]
    shown = lambda r: None if r is None else [round(v, 3) for v in r.tolist()][:6]      # noqa: E731
    if got[0] != want[0]:
        expected, answer = f"accepted={want[0]}", f"accepted={got[0]}"
        q_x = 1.0 if q is None else float(q[token])
        hint = (f"with p_target[x] = {float(p[token]):.3f}, p_draft[x] = {q_x:.3f} and u = {u:.3f}, "
                f"the draft token is accepted when u < min(1, p_target[x] / p_draft[x]).")
    else:
        expected, answer = f"the residual {shown(want[1])}", shown(got[1])
        hint = "after a rejection return residual = (p_target - p_draft).clamp_min(0), divided by its sum."
    point_masses = q is None                        # then the point-mass mistakes are named first
    mistakes = sorted(ACCEPT_MISTAKES.items(), key=lambda item: point_masses != item[0].startswith("a point"))
    for name, (mistake, mistake_hint) in mistakes if named else ():
        if all(_same(a, _accept_answer(mistake, *case)) for a, case in zip(answers, cases)):
            hint = f"{name}: {mistake_hint}"
            break
    fail(ACCEPT, expected, answer, hint)


# --- warm-up 2: expected tokens per pass, one acceptance rate per position -------------------

def _products(alphas):
    """alpha_1, alpha_1 alpha_2, ..., alpha_1 ... alpha_k: the chance that drafts 1..i all pass."""
    out, running = [], 1.0
    for a in alphas:
        running *= a
        out.append(running)
    return out


EXPECTED_MISTAKES = {
    "the closed form with the mean rate": (
        lambda al: expected_tokens_per_call(sum(al) / len(al), len(al)) if al else 1.0,
        "(1 - alpha^(k+1)) / (1 - alpha) needs one alpha for every position; with a rate per position, "
        "add up the chance that each draft is reached and passes: alpha_1, then alpha_1 alpha_2, ..."),
    "independent drafts": (lambda al: 1 + sum(al),
                           "draft i counts only if all drafts before it were accepted too: multiply their "
                           "rates, 1 + alpha_1 + alpha_1 alpha_2 + ..."),
    "no bonus token": (lambda al: 1 + sum(_products(al)[:-1]),
                       "a step whose k drafts all pass also gets the target's bonus token: the sum runs to "
                       "alpha_1 ... alpha_k."),
    "no token of the target's own": (lambda al: sum(_products(al)),
                                     "every pass adds one token of the target's own (a correction after a "
                                     "miss, a bonus after k matches): start the sum at 1."),
    "only the all-accepted case": (lambda al: 1 + (_products(al)[-1] * len(al) if al else 0.0),
                                   "a step that stops at draft i still keeps the i - 1 before it: sum the "
                                   "chance of reaching each draft, not only of passing all k."),
}
EXPECTED_CASES = [[], [1.0], [0.5], [0.5, 0.5, 0.5, 0.5], [0.9, 0.8, 0.6, 0.3], [1.0, 1.0, 1.0],
                  [0.0, 0.9], [0.7, 0.0, 0.9], [0.95, 0.9, 0.85, 0.8, 0.75, 0.7]]


def _value(fn, alphas) -> float:
    """fn(alphas) as a float; a division by zero gives NaN."""
    try:
        got = fn(list(alphas))
    except (ZeroDivisionError, OverflowError):
        return math.nan
    except (TypeError, ValueError, IndexError) as error:
        fail(EXPECTED, f"a number for alphas = {list(alphas)}", f"{type(error).__name__}: {error}",
             "alphas is a list of k rates (k may be 0); return one float.")
    try:
        return float(got)
    except (TypeError, ValueError):
        fail(EXPECTED, "a number", repr(got)[:60], "return a float.")


def _close(got: float, want: float) -> bool:
    return math.isfinite(got) and close_enough(got, want, rel=1e-6)


@grades_quietly
@graded(EXPECTED_TOKENS)
def check_expected_tokens(fn) -> None:
    """Check `fn(alphas) -> float`: the expected tokens of one target pass when draft i is
    accepted with probability alphas[i - 1] given that all before it were:
    1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 ... alpha_k (`expected_tokens_per_pass`).
    Notebook 05 (speculative decoding)."""
    got = [_value(fn, alphas) for alphas in EXPECTED_CASES]
    want = [expected_tokens_per_pass(alphas) for alphas in EXPECTED_CASES]
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if not _close(g, w)]
    if not wrong:
        rates = [0.9, 0.8, 0.6, 0.3]
        passed(EXPECTED, f"With rates {rates} a pass yields {expected_tokens_per_pass(rates):.2f} tokens; their mean, "
                         f"{sum(rates) / 4:.3f}, in the closed form would promise "
                         f"{expected_tokens_per_call(sum(rates) / 4, 4):.2f}.")
        return
    i = wrong[0]
    hint = "1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 ... alpha_k: draft i counts if drafts 1..i all pass."
    for name, (mistake, mistake_hint) in EXPECTED_MISTAKES.items():
        if all(_close(g, _value(mistake, alphas)) or (math.isnan(g) and math.isnan(_value(mistake, alphas)))
               for g, alphas in zip(got, EXPECTED_CASES)):
            hint = f"{name}: {mistake_hint}"
            break
    fail(EXPECTED, f"{want[i]:.4f} for alphas = {EXPECTED_CASES[i]}", f"{got[i]:.4f}", hint)


# --- exercise: one greedy speculative step -------------------------------------------------

@torch.inference_mode()
def reference_speculative_step(target, cache, pending: int, drafted: list[int]) -> list[int]:
    """One greedy speculative step: one target pass over [pending, d_1..d_k], keep the drafts
    while they equal the target's choice, add its own next token (a correction at the first
    miss, a bonus after k matches), and roll the cache back to pending + the accepted drafts.
    Notebook 05 (speculative decoding)."""
    start = cache.length
    fed = torch.tensor([[pending, *drafted]], device=target.device)             # (1, k + 1)
    choice = target.logits(target(fed, cache=cache))[0].argmax(dim=-1).tolist()  # k + 1 next-token choices
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    cache.truncate(start + 1 + n)
    return drafted[:n] + [choice[n]]


def _require_one_pass(calls: list[dict], drafted: list[int], where: str) -> None:
    """The step must verify every draft in ONE target pass of k + 1 tokens: k + 1 passes of one
    token give the same tokens and are plain decoding, the very cost speculation removes."""
    fed = [c["tokens"] for c in calls]
    if fed != [len(drafted) + 1]:
        fail(STEP, f"one target pass over [pending, d_1..d_k], {len(drafted) + 1} tokens, for {where}",
             f"{len(fed)} pass(es) of {fed} tokens",
             "feed the pending token and all k drafts together, shape (1, k + 1), in one call of the target: "
             "its k + 1 logits check every draft at once; one pass per token is plain decoding.")


def _run_step(fn, target, prompt, drafted, where: str = "this step"):
    """The learner's step from a cache holding prompt[:-1]: (new tokens, cache length it left - start).
    The target is handed over inside a `CountingModel`, and its passes are checked (`_require_one_pass`)."""
    cache = StaticKVCache.for_model(target, 1, len(prompt) + len(drafted) + 2)
    counting = CountingModel(target)
    with torch.inference_mode():
        target(torch.tensor([prompt[:-1]], device=target.device), cache=cache)     # fills the cache
        start = cache.length
        tokens = fn(counting, cache, prompt[-1], list(drafted))
    _require_one_pass(counting.calls, drafted, where)
    try:
        tokens = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    except (TypeError, ValueError):
        fail(STEP, "a list of token ids", repr(tokens)[:60], "return drafted[:n] + [the target's token].")
    return tokens, cache.length - start


def _generate(step, target, prompt, new_tokens, propose):
    """Greedy speculative generation with `step`; propose(context) -> the drafts."""
    cache = StaticKVCache.for_model(target, 1, len(prompt) + new_tokens + 16)
    context = list(prompt)
    with torch.inference_mode():
        target(torch.tensor([prompt[:-1]], device=target.device), cache=cache)     # fills the cache
        while len(context) < len(prompt) + new_tokens:
            context += [int(t) for t in step(target, cache, context[-1], list(propose(context)))]
    return context[len(prompt): len(prompt) + new_tokens]


def _step_scenarios(target, prompt, greedy):
    """(name, drafted, right tokens, right cache growth): every way a step can end."""
    g, k = greedy, 4
    wrong = (g[0] + 1) % target.config.vocab_size
    with torch.inference_mode():                     # the target's choice after [pending, wrong]
        after_wrong = int(target.logits(target(torch.tensor([prompt + [wrong]], device=target.device)), at=-1)[0]
                          .argmax())
    return [("all k drafts right", g[:k], g[:k + 1], k + 1),
            ("the first draft wrong", [wrong] + g[1:k], g[:1], 1),
            ("the third draft wrong", g[:2] + [(g[2] + 1) % target.config.vocab_size, g[3]], g[:3], 3),
            ("a draft that matches after the first miss", [wrong, after_wrong, g[2], g[3]], g[:1], 1),
            ("no drafts at all", [], g[:1], 1)]


@grades_quietly
@graded(GREEDY_STEP)
def check_speculative_step(fn, model=None, prompt=None, new_tokens: int = 16) -> None:
    """Check `fn(target, cache, pending, drafted) -> new tokens` (greedy): one target pass,
    the accepted prefix plus the target's correction or bonus token, the cache rolled back.

    Notebook 05 (speculative decoding). The checker runs the step on a tiny model in every
    way a step can end, then generates with it; with `model` and `prompt` (token ids) it
    also generates `new_tokens` on that model with prompt lookup drafting, as the notebook does.
    """
    target = lively_model("tiny-llama")
    small_prompt = list(b"The cat sat on")
    with torch.inference_mode():
        greedy = _generate(reference_speculative_step, target, small_prompt, 8, lambda context: [])
    for name, drafted, want, growth in _step_scenarios(target, small_prompt, greedy):
        where = f"{name} (k = {len(drafted)}, {len(want) - 1} should be accepted)"
        got, grew = _run_step(fn, target, small_prompt, drafted, where)
        if got != want:
            n = len(want) - 1
            if name == "all k drafts right" and got == want[:-1]:
                hint = "no bonus token: when all k drafts pass, add the target's choice at position k."
            elif len(got) - 1 > n and got[:-1] == list(drafted[:len(got) - 1]):
                hint = ("accepting after a miss: stop at the first draft that differs; the later positions "
                        "were scored after a wrong token.")
            elif got[:n] == want[:n] and len(got) == n:
                hint = "add the target's own token after the accepted drafts (its correction, or the bonus)."
            else:
                hint = ("off by one in the logits alignment: the logits at position i (the fed token i: "
                        "pending, d_1, ...) predict the token after it, so d_(i+1) is checked against the "
                        "argmax at position i, and the token the target adds is the argmax at position n.")
            fail(STEP, f"{want} for {where}", got, hint)
        if grew != growth:
            if grew == len(drafted) + 1 and growth < grew:
                hint = "no rollback: the cache still holds the rejected drafts; cache.truncate(start + 1 + n)."
            else:
                hint = ("rollback off by one: keep the pending token and the n accepted drafts, "
                        "cache.truncate(start + 1 + n) with start = cache.length before the pass; the "
                        "target's own token goes in with the next pass.")
            fail(STEP, f"the cache {growth} longer after {where}", f"{grew} longer", hint)
    # a whole generation: a draft that is right most of the time, wrong every third token
    oracle = lambda context: [t if (len(context) + i) % 3 else (t + 1) % target.config.vocab_size  # noqa: E731
                              for i, t in enumerate(greedy[len(context) - len(small_prompt):][:3])]
    got = _generate(fn, target, small_prompt, 8, oracle)
    if got != greedy:
        fail(STEP, greedy, got, "a generation with your step drifts from plain greedy decoding; check the "
                                "cache length after each step: start + 1 + n.")
    if model is not None and prompt is not None:
        lookup = PromptLookupDraft(ngram=3)
        want = _generate(reference_speculative_step, model, list(prompt), new_tokens, lambda c: lookup.propose(c, 4)[0])
        got = _generate(fn, model, list(prompt), new_tokens, lambda c: lookup.propose(c, 4)[0])
        if got != want:
            fail(STEP, want, got, f"on {model.config.name} with prompt lookup the tokens differ; check "
                                  "the alignment and the rollback.")
    passed(STEP, "Each step keeps the matching drafts, adds the target's own token and rolls the cache "
                 "back, so the tokens are plain greedy decoding's.")
