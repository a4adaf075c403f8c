"""Checker cases of notebook 05 (speculative decoding): the reference and each typical mistake."""

from labsupport.checks.speculative import check_accept_step, check_expected_tokens, reference_accept_step
from labsupport.speculative import expected_tokens_per_call

from checker_cases.common import accepts, refuses


# --- notebook 05 (speculative decoding) ---------------------------------------------------

def always_accept(p, q, x, u):
    return True, None


def no_min(p, q, x, u):                        # compares u with p alone
    if u < float(p[x]):
        return True, None
    r = (p - q).clamp_min(0)
    return False, r / r.sum()


def unnormalized(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, (p - q).clamp_min(0)


def resample_target(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, p


NOTEBOOK_05 = [
    accepts(check_accept_step, "reference", reference_accept_step),
    refuses(check_accept_step, "always-accept", "accepted", always_accept),
    refuses(check_accept_step, "no-min", "min", no_min),
    refuses(check_accept_step, "unnormalized-residual", "sum", unnormalized),
    refuses(check_accept_step, "resample-the-target", "double-counts", resample_target),
    accepts(check_expected_tokens, "reference", expected_tokens_per_call),
    refuses(check_expected_tokens, "sum-to-k-minus-1", "k \\+ 1",
            lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k),
    refuses(check_expected_tokens, "divides-at-alpha-1", "alpha = 1", lambda a, k: (1 - a ** (k + 1)) / (1 - a)),
    refuses(check_expected_tokens, "independent-drafts", "all before it", lambda a, k: a * k + 1),
]
