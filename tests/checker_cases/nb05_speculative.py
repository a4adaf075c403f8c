"""Checker cases of notebook 05 (speculative decoding): the reference and each typical mistake."""

import torch

import labsupport.checks.speculative as speculative_checks
from labsupport.checks.speculative import (check_accept_step, check_expected_tokens, check_speculative_step,
                                           reference_accept_step, reference_speculative_step)
from labsupport.engine import speculative as speculative_engine
from labsupport.engine.speculative import verify
from labsupport.lab import speculative_math
from labsupport.lab.speculative_math import expected_tokens_per_pass

from checker_cases.common import accepts, refuses

OWN_CODE = "expected your own code"


def _closure_of(function):
    def learner(*args):
        return function(*args)
    return learner


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


def accept_step(p_target, p_draft, token, u):     # the notebook's solution
    if p_draft is None:
        p_draft = torch.zeros_like(p_target)
        p_draft[token] = 1.0
    ratio = float(p_target[token]) / float(p_draft[token])
    if u < min(1.0, ratio):
        return True, None
    residual = (p_target - p_draft).clamp_min(0)
    return False, residual / residual.sum()


def general_only(p, q, x, u):          # right for a draft with a distribution; q None crashes
    return accept_step(p, q, x, u) if q is not None else (u < float(p[x] / q[x]), None)


def point_mass_always_accepted(p, q, x, u):
    return (True, None) if q is None else accept_step(p, q, x, u)


def point_mass_residual_p(p, q, x, u):  # forgets that max(0, p - one-hot) drops the drafted token
    if q is None:
        return (True, None) if u < float(p[x]) else (False, p / p.sum())
    return accept_step(p, q, x, u)


def accepted_at_the_ratio(p, q, x, u):   # u <= min(1, p/q): accepts u equal to the ratio
    q = torch.zeros_like(p).index_fill_(0, torch.tensor([x]), 1.0) if q is None else q
    if u <= min(1.0, float(p[x]) / float(q[x])):
        return True, None
    return False, (p - q).clamp_min(0) / (p - q).clamp_min(0).sum()


def accept_by_the_engines_verify(p, q, x, u):   # the engine's verify loop, one draft, its own random number
    n, token, kind = verify(torch.stack([p, p]), torch.stack([p, p]).argmax(-1), [x], None if q is None else q[None],
                            torch.Generator().manual_seed(int(u * 1e6)))
    return n == 1, None if n == 1 else accept_step(p, q, x, 1.0)[1]


def accept_with_the_checkers_rule(p, q, x, u):  # the checker's own slip helper, with the right test and residual
    return speculative_checks._rule(lambda px, qx, v: v < min(1.0, px / qx),
                                    lambda p_, q_: (p_ - q_).clamp_min(0) / (p_ - q_).clamp_min(0).sum())(p, q, x, u)


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


def expected_by_the_checkers_products(alphas):   # the checker's own helper
    return 1 + sum(speculative_checks._products(alphas))


def expected_by_default(alphas, _formula=expected_tokens_per_pass):
    return _formula(alphas)


# --- exercise 3: one greedy speculative step --------------------------------------------------

@torch.inference_mode()
def speculative_step(target, cache, pending, drafted):    # the notebook's solution
    start = cache.length
    fed = torch.tensor([[pending, *drafted]], device=target.device)
    choice = target.logits(target(fed, cache=cache))[0].argmax(dim=-1).tolist()
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    cache.truncate(start + 1 + n)
    return drafted[:n] + [choice[n]]


@torch.inference_mode()
def step_by_the_engines_verify(target, cache, pending, drafted):   # one pass, then the engine's verify
    start = cache.length
    logits = target.logits(target(torch.tensor([[pending, *drafted]], device=target.device), cache=cache))[0]
    n, token, kind = verify(None, logits.argmax(dim=-1), list(drafted), None, None)
    cache.truncate(start + 1 + n)
    return drafted[:n] + [token]


@torch.inference_mode()
def step_rolled_back_by_reserve(target, cache, pending, drafted):   # a method of the cache it is given
    start = cache.length
    choice = _choices(target, cache, pending, drafted)
    n = _prefix(drafted, choice)
    cache.truncate(start)
    cache.reserve(1 + n)
    return drafted[:n] + [choice[n]]

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
    accepts(check_accept_step, "reference", accept_step),
    refuses(check_accept_step, "the-checkers-own-reference", OWN_CODE, reference_accept_step),
    refuses(check_accept_step, "the-checkers-reference-as-a-default-argument", OWN_CODE,
            lambda p, q, x, u, _step=reference_accept_step: _step(p, q, x, u)),
    refuses(check_accept_step, "the-checkers-reference-in-a-closure", OWN_CODE, _closure_of(reference_accept_step)),
    refuses(check_accept_step, "the-checkers-own-slip-helper", "_rule", accept_with_the_checkers_rule),
    refuses(check_accept_step, "the-engines-verify", "speculative.verify", accept_by_the_engines_verify),
    refuses(check_accept_step, "u-equal-to-the-ratio-accepted", "accepted=False", accepted_at_the_ratio),
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
    accepts(check_expected_tokens, "a-loop-of-products", expected_right),
    refuses(check_expected_tokens, "the-labs-formula", OWN_CODE, expected_tokens_per_pass),
    refuses(check_expected_tokens, "the-labs-formula-as-a-default-argument", OWN_CODE, expected_by_default),
    refuses(check_expected_tokens, "the-labs-formula-in-a-closure", OWN_CODE, _closure_of(expected_tokens_per_pass)),
    refuses(check_expected_tokens, "the-labs-formula-through-its-module", OWN_CODE,
            lambda alphas: speculative_math.expected_tokens_per_pass(alphas)),
    refuses(check_expected_tokens, "the-checkers-own-helper", "_products", expected_by_the_checkers_products),
    refuses(check_expected_tokens, "closed-form-with-the-mean-rate", "the closed form with the mean rate", mean_rate),
    refuses(check_expected_tokens, "independent-drafts", "independent drafts", independent),
    refuses(check_expected_tokens, "no-bonus-token", "no bonus token", no_bonus),
    refuses(check_expected_tokens, "no-token-of-the-target", "no token of the target's own", no_own_token),
    refuses(check_expected_tokens, "only-all-accepted", "only the all-accepted case", all_or_nothing),
    accepts(check_speculative_step, "reference", speculative_step),
    refuses(check_speculative_step, "the-checkers-own-reference", OWN_CODE, reference_speculative_step),
    refuses(check_speculative_step, "the-engines-verify", "speculative.verify", step_by_the_engines_verify),
    refuses(check_speculative_step, "the-engines-generation", "speculative_generate",
            lambda target, cache, pending, drafted: speculative_engine.speculative_generate(target, None, [pending])),
    refuses(check_speculative_step, "a-method-of-the-cache-it-is-given", "StaticKVCache.reserve",
            step_rolled_back_by_reserve),
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


def verify_sampled(p_target, p_draft, drafted, generator):     # the notebook's solution
    for i, d in enumerate(drafted):
        u = float(torch.rand((), generator=generator))
        if u < min(1.0, float(p_target[i, d]) / float(p_draft[i, d])):
            continue
        residual = (p_target[i] - p_draft[i]).clamp_min(0)
        return list(drafted[:i]) + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    k = len(drafted)
    return list(drafted) + [int(torch.multinomial(p_target[k], 1, generator=generator))]


def verify_one_uniform_for_all(p, q, drafted, generator):
    """One uniform number reused for every draft: right at the first position, 0.13 off at the second."""
    u = float(torch.rand((), generator=generator))
    for i, d in enumerate(drafted):
        if u < min(1.0, float(p[i, d] / q[i, d])):
            continue
        return drafted[:i] + [from_residual(p[i], q[i], generator)]
    return list(drafted) + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def verify_by_the_engine(p, q, drafted, generator):
    n, token, kind = verify(p, p.argmax(dim=-1), list(drafted), q, generator)
    return list(drafted[:n]) + [token]


def verify_engine_by_default(p, q, drafted, generator, _verify=verify):
    n, token, kind = _verify(p, p.argmax(dim=-1), list(drafted), q, generator)
    return list(drafted[:n]) + [token]


def _verify_helper(p, q, drafted, generator):
    return speculative_engine.verify(p, p.argmax(dim=-1), list(drafted), q, generator)


def verify_engine_through_a_helper(p, q, drafted, generator):
    n, token, kind = _verify_helper(p, q, drafted, generator)
    return list(drafted[:n]) + [token]


def verify_with_the_labs_distribution(p, q, drafted, generator):
    """The replacement drawn from the lab's exact output distribution of a position, minus what was kept."""
    for i, d in enumerate(drafted):
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[i, d] / q[i, d])):
            continue
        emitted = speculative_math.speculative_token_distribution(p[i], q[i])
        return drafted[:i] + [int(torch.multinomial((emitted - torch.minimum(p[i], q[i])).clamp_min(0), 1,
                                                    generator=generator))]
    return list(drafted) + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def verify_sampling_p_directly(p, q, drafted, generator):
    """The right first-token distribution by another method: ignores the drafts, samples p."""
    return [int(torch.multinomial(p[0], 1, generator=generator))]


NOTEBOOK_05 += [
    accepts(check_verify_sampled, "reference", verify_sampled),
    refuses(check_verify_sampled, "the-checkers-own-reference", OWN_CODE, reference_verify_sampled),
    refuses(check_verify_sampled, "the-engines-verify", OWN_CODE, verify_by_the_engine),
    refuses(check_verify_sampled, "the-engines-verify-as-a-default-argument", OWN_CODE, verify_engine_by_default),
    refuses(check_verify_sampled, "the-engines-verify-in-a-closure", OWN_CODE,
            _closure_of(lambda p, q, d, g: [*d[:verify(p, p.argmax(-1), list(d), q, g)[0]], 0])),
    refuses(check_verify_sampled, "the-engines-verify-through-a-helper", OWN_CODE, verify_engine_through_a_helper),
    refuses(check_verify_sampled, "the-labs-distribution", "speculative_token_distribution",
            verify_with_the_labs_distribution),
    refuses(check_verify_sampled, "one-uniform-for-every-draft", "fresh uniform number", verify_one_uniform_for_all),
    accepts(check_verify_sampled, "vectorised", verify_in_one_call),
    accepts(check_verify_sampled, "multinomial-of-the-unnormalised-residual", verify_right_multinomial_unnormalised),
    refuses(check_verify_sampled, "residual-from-p", "drawing from p itself", verify_residual_from_p),
    refuses(check_verify_sampled, "no-bonus-token", "no bonus token", verify_without_bonus),
    refuses(check_verify_sampled, "greedy-style-acceptance", "only when p\\(d\\) >= q\\(d\\)", verify_greedy_style),
    refuses(check_verify_sampled, "q-over-p", "not q/p", verify_q_over_p),
    refuses(check_verify_sampled, "not-renormalised", "not divided by its sum", verify_not_renormalised),
    refuses(check_verify_sampled, "sampling-p-directly", "always when p\\(d\\) >= q\\(d\\)", verify_sampling_p_directly),
]


# --- mutants of the notebook's solutions that compute what the solution computes (scripts/checker_mutants.py) ---

_MIN_SYMMETRIC = ("min(ratio, 1.0) is min(1.0, ratio): the ratio of two probabilities is never NaN here (a zero "
                  "p_draft[x] raises ZeroDivisionError in both), and min of two numbers does not depend on their order")
_U_BELOW_ONE = ("u is a uniform number in [0, 1): u < min(2, ratio) and u < min(1, ratio) agree for every u below 1")
_MULTINOMIAL_NORMALISES = ("torch.multinomial takes unnormalised weights: max(p - q, 0), divided by its sum, "
                           "multiplied by it or left as it is, gives the same distribution to draw from")
EQUIVALENT_MUTANTS = {
    "spec-accept-step": {"7:11:swap-arguments:0<->1": _MIN_SYMMETRIC, "7:15:constant:1.0*2": _U_BELOW_ONE},
    "spec-greedy-step": {
        "5:53:constant:0-1": "the step verifies one sequence: the logits are (1, k + 1, vocab), whose row -1 is row 0",
        "5:67:unary:drop-USub": "the logits of the one row are (k + 1, vocab): argmax over dim 1 is argmax over dim -1"},
    "spec-verify-sampled": {
        "5:11:compare:0-Lt->LtE": ("u <= ratio differs from u < ratio only when the uniform number the learner drew "
                                   "equals p/q exactly, with probability at most 2^-24 per draft: the same "
                                   "distribution of tokens, and the checker cannot know which u was drawn"),
        "5:15:swap-arguments:0<->1": _MIN_SYMMETRIC, "5:19:constant:1.0*2": _U_BELOW_ONE,
        "8:58:operator:Div->Mult": _MULTINOMIAL_NORMALISES, "8:58:drop-term:keep-left": _MULTINOMIAL_NORMALISES},
}
