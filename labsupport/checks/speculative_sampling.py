"""Checker for notebook 05's sampling exercise: the verify loop of speculative sampling, checked
statistically (Leviathan et al. 2023, algorithm 1; Chen et al. 2023, algorithm 2).

Introduced in notebook 05 (speculative decoding). The learner's `verify_sampled(p_target,
p_draft, drafted, generator)` gets k drafted tokens, the draft's distributions q_1..q_k (k, vocab)
and the target's p_1..p_(k+1) (k + 1, vocab); it accepts draft i with probability
min(1, p_i(d_i) / q_i(d_i)), replaces the first rejected one by a token drawn from
normalize(max(p_i - q_i, 0)) and ends there, or adds a bonus token drawn from p_(k+1) after k
acceptances. Three fixed settings on a vocabulary of 5 tokens, each run many times with drafts
drawn from q by the checker:

* A: k = 2, q far from p at both positions;
* B: k = 2, the first draft always accepted (p_1 = q_1);
* C: k = 1 and p_1 = q_1: every call ends with a bonus token.

At EVERY position j of every setting, among the calls whose first j drafts were accepted, the
token at position j must be distributed as p_(j+1), and draft j + 1 must be accepted as often as
sum(min(p, q)) = 1 - TV(p, q): a uniform number reused for every draft passes position 1 of B
(after a sure acceptance) but not of A, where its second token is 0.13 away from p_2.
Every call is also checked for what no right answer ever does (a draft with p >= q rejected, a
replacement where p <= q, no bonus after k acceptances). Each test's threshold follows from the
number of calls it counts, so that a right answer fails it with a probability below `DELTA`
(Bretagnolle-Huber-Carol for frequencies, Hoeffding for rates): all of them together below
`false_refusal_bound()`, whatever its random numbers; each wrong rule misses them by far.
"""

from __future__ import annotations

import math

import torch

from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded

EXERCISE = "the sampling verify loop"
SAMPLED = Exercise(
    title=EXERCISE,
    teaches="the verify loop of speculative sampling: draft i accepted when a fresh uniform number is below "
            "min(1, p_i(d_i) / q_i(d_i)), the first rejected one replaced from normalize(max(p_i - q_i, 0)), "
            "a bonus token from p_(k+1) after k acceptances",
    computed_by=("labsupport.engine.speculative.verify",))
VOCAB = 5
DELTA = 1e-8                                            # the chance that one test refuses a right answer
SAMPLES = {"C": 3000, "B": 3000, "A": 6000}             # C first: a missing bonus token shows there
LEAST = 50                                              # fewer calls at a position: no test there

_P = torch.tensor([[0.45, 0.25, 0.15, 0.10, 0.05],     # the target's distributions, one row per position
                   [0.05, 0.10, 0.40, 0.25, 0.20],
                   [0.30, 0.05, 0.05, 0.20, 0.40]], dtype=torch.float64)
_Q = torch.tensor([[0.05, 0.15, 0.25, 0.15, 0.40],     # the draft's: far from p, so that wrong rules show
                   [0.35, 0.30, 0.05, 0.05, 0.25]], dtype=torch.float64)


def reference_verify_sampled(p_target: torch.Tensor, p_draft: torch.Tensor, drafted: list[int],
                             generator: torch.Generator | None = None) -> list[int]:
    """One sampling verify pass: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the
    first rejection draw the replacement from normalize(max(p_i - q_i, 0)) and stop; after k
    acceptances draw the bonus token from p_(k+1). p_target (k + 1, vocab), p_draft (k, vocab).
    Returns the accepted drafts and the target's token. Notebook 05 (speculative decoding)."""
    for i, d in enumerate(drafted):
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u < min(1.0, float(p_target[i, d]) / float(p_draft[i, d])):
            continue
        residual = (p_target[i] - p_draft[i]).clamp_min(0)                    # (vocab,)
        return list(drafted[:i]) + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    k = len(drafted)
    return list(drafted) + [int(torch.multinomial(p_target[k], 1, generator=generator))]


def settings() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The three settings (p_target (k + 1, vocab), p_draft (k, vocab)), float32 as a model gives them.
    Notebook 05 (speculative decoding)."""
    return {"C": (_P[:2].float(), _P[:1].float()),                           # k = 1, q_1 = p_1
            "B": (_P.float(), torch.stack([_P[0], _Q[1]]).float()),          # k = 2, q_1 = p_1: always accepted
            "A": (_P.float(), _Q.float())}                                    # k = 2


def false_refusal_bound() -> float:
    """An upper bound on the chance that a right answer is refused: `DELTA` for each test, one frequency
    test per position and one rate test per draft in each setting (Bretagnolle-Huber-Carol,
    P(TV >= t) <= 2^V exp(-2 N t^2), and Hoeffding, 2 exp(-2 N e^2), at thresholds set from N); the
    per-call checks never refuse a right answer. Notebook 05 (speculative decoding)."""
    tests = sum(2 * q.shape[0] + 1 for _, q in settings().values())
    return tests * DELTA


def _tv_limit(n: int) -> float:
    """The total variation from p that n draws of p exceed with probability DELTA at most."""
    return math.sqrt((VOCAB * math.log(2) + math.log(1 / DELTA)) / (2 * n))


def _rate_limit(n: int) -> float:
    """The distance from its chance that an acceptance rate over n drafts exceeds with probability DELTA at most."""
    return math.sqrt(math.log(2 / DELTA) / (2 * n))


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def _answer(fn, p, q, drafted, generator, setting) -> list[int]:
    """The learner's tokens for one call, as a list of ints of the right form."""
    got = call_learner(EXERCISE, "a list of token ids", "the function raised for a valid input: p_target "
                       "(k + 1, vocab), p_draft (k, vocab), drafted a list of k ints, generator a "
                       "torch.Generator to pass to torch.rand and torch.multinomial.",
                       fn, p.clone(), q.clone(), list(drafted), generator)
    try:
        tokens = [int(t) for t in (got.tolist() if isinstance(got, torch.Tensor) else got)]
    except (TypeError, ValueError):
        fail(EXERCISE, "a list of token ids", repr(got)[:60], "return drafted[:n] + [the target's token].")
    k, n = len(drafted), len(tokens) - 1
    if not 1 <= len(tokens) <= k + 1 or tokens[:n] != list(drafted[:n]) or not 0 <= tokens[-1] < VOCAB:
        fail(EXERCISE, f"the accepted drafts then one token of the target's, 1 to {k + 1} ids (setting {setting}, "
                       f"drafts {list(drafted)})", tokens,
             "return drafted[:n] + [token]: the first n drafts, accepted, then the replacement or the bonus.")
    return tokens


def _never_right(outputs: list[list[int]], drafts: list[list[int]], p, q, setting: str) -> None:
    """Refuse what no right answer ever does, in any call: no bonus after k acceptances, a draft with
    p >= q rejected, a replacement where p <= q (the residual is 0 there)."""
    if all(out == d for out, d in zip(outputs, drafts)):
        fail(EXERCISE, f"a bonus token after the k accepted drafts (setting {setting}, drafts {drafts[0]})",
             outputs[0], "no bonus token: after all k drafts are accepted, draw one more token from p_target[k].")
    outside = []                                        # (call, replacement) where the residual is 0
    for out, d in zip(outputs, drafts):
        n = len(out) - 1
        if n == len(d):
            continue
        p_n, q_n, x = p[n], q[n], out[-1]
        if float(p_n[d[n]]) >= float(q_n[d[n]]):
            fail(EXERCISE, f"draft {n + 1} accepted (setting {setting}, drafts {d}: p = {float(p_n[d[n]]):.2f} "
                           f">= q = {float(q_n[d[n]]):.2f})", out,
                 "a draft is accepted with probability min(1, p(d) / q(d)), so always when p(d) >= q(d): the "
                 "ratio is p/q, not q/p, and the draft's own token is kept, not drawn again.")
        if float(p_n[x]) <= float(q_n[x]):
            outside.append((out, d, x, float(p_n[x]), float(q_n[x])))
    if outside:
        out, d, x, p_x, q_x = outside[0]
        hint = ("drawing from p itself: after a rejection draw from the residual max(p - q, 0) divided by its "
                "sum, which is 0 wherever p <= q.")
        if all(x == VOCAB - 1 for _, _, x, _, _ in outside):     # every one at the end of the vocabulary
            hint = ("a residual not divided by its sum: max(p - q, 0) adds up to less than 1, so sampling it by "
                    "its cumulative sum runs past its end, onto the last token; normalize it first.")
        fail(EXERCISE, f"a replacement x with p(x) > q(x) (setting {setting}, drafts {d})",
             f"{out}, token {x} with p = {p_x:.2f}, q = {q_x:.2f} ({len(outside)} such calls)", hint)


def _draws(q: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(n, k) drafts, row j of q drawn n times: what a draft sampling from q proposes."""
    return torch.stack([torch.multinomial(row, n, replacement=True, generator=generator) for row in q], 1)


def _rate_hint(rate: float, p: torch.Tensor, q: torch.Tensor, before: tuple | None) -> str:
    """Name the acceptance rule whose rate is nearest to the one measured; `before`: (p, q) of the
    draft before, for the rate a uniform number reused from its test gives."""
    accept = lambda p_, q_: torch.minimum(p_ / q_, torch.ones_like(p_))           # noqa: E731
    rules = {"accepting only when p(d) >= q(d), as greedy decoding would": float(q[p >= q].sum()),
             "the ratio upside down, q/p instead of p/q": float((q * torch.minimum(q / p, torch.ones_like(p))).sum()),
             "accepting with probability p(d) alone": float((q * p).sum())}
    if before is not None:                               # u < a_before(d) already: P(u < a(d) | u < a_before(d))
        a0, q0 = accept(*before), before[1]
        both = (q0[:, None] * q[None, :] * torch.minimum(a0[:, None], accept(p, q)[None, :])).sum()
        rules["one uniform number reused for every draft"] = float(both / (q0 * a0).sum())
    name, expected = min(rules.items(), key=lambda item: abs(item[1] - rate))
    if abs(expected - rate) < 0.05:
        return f"{name}: accept with probability min(1, p(d) / q(d)), one fresh uniform number per draft."
    return "accept draft i when a uniform u, drawn afresh for it, is below min(1, p_i(d_i) / q_i(d_i))."


def _position_hint(setting: str, j: int, k: int) -> str:
    """What a wrong distribution at position j of a setting says about the loop."""
    if j == k:
        return "the bonus token comes from p_target[k], the row after the last draft."
    if j == 0:
        return "accept with min(1, p/q) and replace from normalize(max(p - q, 0))."
    if setting == "B":
        return ("each position i has its own p_target[i] and p_draft[i]: the loop must go on after an "
                "accepted draft.")
    return ("after an acceptance, the next draft's test needs a fresh uniform number (torch.rand inside the loop): "
            "one u reused is known to be small once a draft passed, so the later drafts pass too often; and "
            "draft i uses row i of p_target and p_draft.")


def _check_position(outputs: list[list[int]], p, q, setting: str, j: int) -> None:
    """Among the calls whose first j drafts were accepted: draft j + 1 accepted as often as
    sum(min(p_j, q_j)), and the token at position j distributed as p_j."""
    k = q.shape[0]
    reached = [out for out in outputs if len(out) > j]
    if len(reached) < LEAST:
        return
    where = f"in setting {setting}" + (f", after draft {j} was accepted ({len(reached)} calls)" if j else "")
    if j < k:
        rate = sum(len(out) > j + 1 for out in reached) / len(reached)
        expected = float(torch.minimum(p[j], q[j]).sum())
        if abs(rate - expected) > _rate_limit(len(reached)):
            fail(EXERCISE, f"draft {j + 1} accepted {expected:.2f} of the time {where}: sum(min(p, q)) = 1 - TV(p, q)",
                 f"{rate:.2f} in {len(reached)} calls",
                 _rate_hint(rate, p[j], q[j], (p[j - 1], q[j - 1]) if j and setting == "A" else None))
    freq = torch.bincount(torch.tensor([out[j] for out in reached]), minlength=VOCAB) / len(reached)
    distance, limit = _tv(freq, p[j]), _tv_limit(len(reached))
    if distance > limit:
        what = "the bonus token" if j == k else f"token {j + 1}"
        fail(EXERCISE, f"{what} distributed as p_target[{j}] {[round(v, 2) for v in p[j].tolist()]} {where} "
                       f"(within {limit:.3f} in total variation)",
             f"{[round(v, 2) for v in freq.tolist()]}, {distance:.3f} away", _position_hint(setting, j, k))


@grades_quietly
@graded(SAMPLED)
def check_verify_sampled(fn, seed: int = 0) -> None:
    """Check `fn(p_target, p_draft, drafted, generator) -> tokens`, the verify loop of speculative
    sampling, by its acceptance rates and output frequencies at every position of three settings
    (module docstring).

    Introduced in notebook 05 (speculative decoding). A right answer is refused with a
    probability below `false_refusal_bound()` (about 1e-7), whatever its random numbers; a call
    of the package's verify (`engine.speculative.verify`) is refused.
    """
    generator = torch.Generator().manual_seed(seed)
    for setting, (p, q) in settings().items():
        drafts = _draws(q, SAMPLES[setting], generator).tolist()                    # (n, k)
        outputs = [_answer(fn, p, q, d, generator, setting) for d in drafts]
        _never_right(outputs, drafts, p, q, setting)
        for j in range(q.shape[0] + 1):
            _check_position(outputs, p, q, setting, j)
    passed(EXERCISE, f"In {sum(SAMPLES.values())} calls the tokens came out distributed as the target's p at "
                     f"every position (a right answer fails this check with probability below "
                     f"{false_refusal_bound():.0e}).")
