"""Checker cases of notebook 05 (speculative decoding): the reference and each typical mistake."""

import torch

from labsupport.checks.speculative import (check_accept_step, check_expected_tokens, check_speculative_step,
                                           reference_accept_step, reference_speculative_step)
from labsupport.lab.speculative_math import expected_tokens_per_pass

from checker_cases.common import accepts, refuses


# --- exercise 1: the accept/reject step (p_draft None: a point mass, prompt lookup), written as a learner might -------------------------

def _accept(test, residual):
    def fn(p, q, x, u):
        if test(p, q, x, u):
            return True, None
        return False, residual(p, q)
    return fn


ratio_test = lambda p, q, x, u: u < min(1.0, float(p[x] / q[x]))      # noqa: E731
residual = lambda p, q: (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()  # noqa: E731

always_accept = lambda p, q, x, u: (True, None)                       # noqa: E731
against_p = _accept(lambda p, q, x, u: u < float(p[x]), residual)
upside_down = _accept(lambda p, q, x, u: u < min(1.0, float(q[x] / p[x])), residual)
reversed_test = _accept(lambda p, q, x, u: u > min(1.0, float(p[x] / q[x])), residual)
unnormalized = _accept(ratio_test, lambda p, q: torch.relu(p - q))
from_target = _accept(ratio_test, lambda p, q: p)
reversed_residual = _accept(ratio_test, lambda p, q: torch.relu(q - p) / torch.relu(q - p).sum())
negative_residual = _accept(ratio_test, lambda p, q: (p - q) / torch.relu(p - q).sum())


def general_only(p, q, x, u):          # right for a draft with a distribution; q None crashes
    return reference_accept_step(p, q, x, u) if q is not None else (u < float(p[x] / q[x]), None)


def point_mass_always_accepted(p, q, x, u):
    return (True, None) if q is None else reference_accept_step(p, q, x, u)


def point_mass_residual_p(p, q, x, u):  # forgets that max(0, p - one-hot) drops the drafted token
    if q is None:
        return (True, None) if u < float(p[x]) else (False, p / p.sum())
    return reference_accept_step(p, q, x, u)


# --- exercise 2: expected tokens per pass, one rate per position -----------------------------

def expected_right(alphas):
    total, reached = 1.0, 1.0
    for a in alphas:
        reached *= a
        total += reached
    return total


def mean_rate(alphas):                 # the closed form of section 6 with the mean rate
    a, k = sum(alphas) / max(len(alphas), 1), len(alphas)
    return (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1


def independent(alphas):               # forgets that draft i needs all before it
    return 1 + sum(alphas)


def no_bonus(alphas):                  # stops one product short
    return expected_right(alphas[:-1]) if alphas else 1.0


def no_own_token(alphas):              # only the accepted drafts
    return expected_right(alphas) - 1


def all_or_nothing(alphas):            # only the all-accepted case
    product = 1.0
    for a in alphas:
        product *= a
    return 1 + len(alphas) * product if alphas else 1.0


# --- exercise 3: one greedy speculative step --------------------------------------------------

def _choices(target, cache, pending, drafted):
    fed = torch.tensor([[pending, *drafted]])                         # (1, k + 1)
    return target.logits(target(fed, cache=cache))[0].argmax(-1).tolist()


def _prefix(drafted, choice):
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    return n


def step_without_bonus(target, cache, pending, drafted):
    start = cache.length
    choice = _choices(target, cache, pending, drafted)
    n = _prefix(drafted, choice)
    cache.truncate(start + 1 + n)
    return drafted[:n] + ([choice[n]] if n < len(drafted) else [])  # forgets the bonus after k matches


def step_without_rollback(target, cache, pending, drafted):
    choice = _choices(target, cache, pending, drafted)
    n = _prefix(drafted, choice)
    return drafted[:n] + [choice[n]]


def step_rollback_one_short(target, cache, pending, drafted):
    start = cache.length
    choice = _choices(target, cache, pending, drafted)
    n = _prefix(drafted, choice)
    cache.truncate(start + n)                                         # drops the pending token
    return drafted[:n] + [choice[n]]


def step_shifted_logits(target, cache, pending, drafted):
    start = cache.length
    choice = _choices(target, cache, pending, drafted)[1:] + [None]  # position i+1 checks d_(i+1): off by one
    n = _prefix(drafted, choice)
    cache.truncate(start + 1 + n)
    return drafted[:n] + [choice[n] if choice[n] is not None else drafted[-1]]


def step_accepting_after_a_miss(target, cache, pending, drafted):
    start = cache.length
    choice = _choices(target, cache, pending, drafted)
    matches = [d == c for d, c in zip(drafted, choice)]
    n = sum(matches)                                                  # counts matches, not the prefix
    cache.truncate(start + 1 + n)
    return drafted[:n] + [choice[n]]



@torch.inference_mode()
def step_one_pass_per_token(target, cache, pending, drafted):
    """The right tokens and cache, by k + 1 one-token passes of the target: plain decoding."""
    start, fed, choice = cache.length, [pending, *drafted], []
    for token in fed:
        logits = target.logits(target(torch.tensor([[token]], device=target.device), cache=cache))
        choice.append(int(logits[0, -1].argmax()))
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    cache.truncate(start + 1 + n)
    return drafted[:n] + [choice[n]]


NOTEBOOK_05 = [
    accepts(check_accept_step, "reference", reference_accept_step),
    refuses(check_accept_step, "always-accept", "always accepting", always_accept),
    refuses(check_accept_step, "u-against-p-alone", "u against p_target alone", against_p),
    refuses(check_accept_step, "ratio-upside-down", "upside down", upside_down),
    refuses(check_accept_step, "test-reversed", "the test reversed", reversed_test),
    refuses(check_accept_step, "unnormalized-residual", "unnormalized residual", unnormalized),
    refuses(check_accept_step, "resample-the-target", "resampling from the target", from_target),
    refuses(check_accept_step, "residual-reversed", "the residual reversed", reversed_residual),
    refuses(check_accept_step, "negative-residual", "negative entries", negative_residual),
    refuses(check_accept_step, "point-mass-not-handled", "what is the draft's distribution q then", general_only),
    refuses(check_accept_step, "point-mass-always-accepted", "not always true", point_mass_always_accepted),
    refuses(check_accept_step, "point-mass-residual-keeps-the-token", "cannot be drawn again", point_mass_residual_p),
    accepts(check_expected_tokens, "reference", expected_tokens_per_pass),
    accepts(check_expected_tokens, "a-loop-of-products", expected_right),
    refuses(check_expected_tokens, "closed-form-with-the-mean-rate", "the closed form with the mean rate", mean_rate),
    refuses(check_expected_tokens, "independent-drafts", "independent drafts", independent),
    refuses(check_expected_tokens, "no-bonus-token", "no bonus token", no_bonus),
    refuses(check_expected_tokens, "no-token-of-the-target", "no token of the target's own", no_own_token),
    refuses(check_expected_tokens, "only-all-accepted", "only the all-accepted case", all_or_nothing),
    accepts(check_speculative_step, "reference", reference_speculative_step),
    refuses(check_speculative_step, "no-bonus-token", "no bonus token", step_without_bonus),
    refuses(check_speculative_step, "no-rollback", "no rollback", step_without_rollback),
    refuses(check_speculative_step, "rollback-one-short", "rollback off by one", step_rollback_one_short),
    refuses(check_speculative_step, "logits-off-by-one", "off by one in the logits alignment", step_shifted_logits),
    refuses(check_speculative_step, "accepting-after-a-miss", "accepting after a miss", step_accepting_after_a_miss),
    refuses(check_speculative_step, "one-target-pass-per-token", "one pass per token is plain decoding",
            step_one_pass_per_token),
]


# --- exercise 4: the sampling verify loop, written as a learner might --------------------------

from labsupport.checks.speculative_sampling import check_verify_sampled, reference_verify_sampled  # noqa: E402


def _verify_with(accept, replace, bonus=True):
    """A verify loop made of accept(p_i, q_i, d, u) -> bool and replace(p_i, q_i, generator) -> token."""
    def fn(p, q, drafted, generator):
        for i, d in enumerate(drafted):
            if accept(p[i], q[i], d, float(torch.rand((), generator=generator))):
                continue
            return drafted[:i] + [replace(p[i], q[i], generator)]
        if not bonus:
            return list(drafted)
        return list(drafted) + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]
    return fn


by_ratio = lambda p, q, d, u: u < min(1.0, float(p[d] / q[d]))                                    # noqa: E731
from_residual = lambda p, q, g: int(torch.multinomial(torch.relu(p - q), 1, generator=g))         # noqa: E731


def _inverse_cdf(weights, generator):
    """Sampling by the cumulative sum, right for a distribution, wrong for weights that add up to less."""
    u = torch.rand((), generator=generator)
    return min(int(torch.searchsorted(weights.cumsum(0), u, right=True)), len(weights) - 1)


def verify_in_one_call(p, q, drafted, generator):
    """Right: all k uniforms at once, vectorised."""
    k = len(drafted)
    idx = torch.arange(k)
    ratio = p[idx, drafted] / q[idx, drafted] if k else p.new_zeros(0)
    rejected = (torch.rand(k, generator=generator) >= ratio.clamp(max=1)).nonzero()
    if len(rejected):
        i = int(rejected[0])
        residual = (p[i] - q[i]).clamp(min=0)
        return drafted[:i] + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return drafted + [int(torch.multinomial(p[k], 1, generator=generator))]


verify_right_multinomial_unnormalised = _verify_with(by_ratio, from_residual)   # multinomial normalises: right
verify_residual_from_p = _verify_with(by_ratio, lambda p, q, g: int(torch.multinomial(p, 1, generator=g)))
verify_without_bonus = _verify_with(by_ratio, from_residual, bonus=False)
verify_greedy_style = _verify_with(lambda p, q, d, u: float(p[d]) >= float(q[d]), from_residual)
verify_q_over_p = _verify_with(lambda p, q, d, u: u < min(1.0, float(q[d] / p[d])), from_residual)
verify_not_renormalised = _verify_with(by_ratio, lambda p, q, g: _inverse_cdf(torch.relu(p - q), g))


def verify_sampling_p_directly(p, q, drafted, generator):
    """The right first-token distribution by another method: ignores the drafts, samples p."""
    return [int(torch.multinomial(p[0], 1, generator=generator))]


NOTEBOOK_05 += [
    accepts(check_verify_sampled, "reference", reference_verify_sampled),
    accepts(check_verify_sampled, "vectorised", verify_in_one_call),
    accepts(check_verify_sampled, "multinomial-of-the-unnormalised-residual", verify_right_multinomial_unnormalised),
    refuses(check_verify_sampled, "residual-from-p", "drawing from p itself", verify_residual_from_p),
    refuses(check_verify_sampled, "no-bonus-token", "no bonus token", verify_without_bonus),
    refuses(check_verify_sampled, "greedy-style-acceptance", "only when p\\(d\\) >= q\\(d\\)", verify_greedy_style),
    refuses(check_verify_sampled, "q-over-p", "not q/p", verify_q_over_p),
    refuses(check_verify_sampled, "not-renormalised", "not divided by its sum", verify_not_renormalised),
    refuses(check_verify_sampled, "sampling-p-directly", "always when p\\(d\\) >= q\\(d\\)", verify_sampling_p_directly),
]
