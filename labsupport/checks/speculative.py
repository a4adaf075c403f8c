"""Checkers for notebook 05 (speculative decoding): the accept/reject step and the expected tokens.

Introduced in notebook 05 (speculative decoding). Each checker compares a
learner's function with the rule of Leviathan et al. (2023) and prints a short
confirmation or raises `CheckFailed` with what was expected, what came back and
a hint. Both are deterministic: the uniform number u is an argument, and the
resampling step is checked through the distribution it would sample from.
"""

from __future__ import annotations

import torch

from ..speculative import expected_tokens_per_call
from . import close_enough, fail, passed

ACCEPT = "the accept/reject-and-resample step"
EXPECTED = "expected tokens per target call"


def reference_accept_step(p_target: torch.Tensor, p_draft: torch.Tensor, token: int,
                          u: float) -> tuple[bool, torch.Tensor | None]:
    """Accept `token` if u < min(1, p_t[x] / p_d[x]); otherwise return the residual
    normalize(max(0, p_t - p_d)) that the replacement token is drawn from.
    Notebook 05 (speculative decoding)."""
    ratio = float(p_target[token]) / float(p_draft[token])
    if u < min(1.0, ratio):
        return True, None
    residual = (p_target - p_draft).clamp_min(0)
    return False, residual / residual.sum()


def _cases() -> list[tuple[torch.Tensor, torch.Tensor, int, float]]:
    """(p_target, p_draft, token, u): draft too confident, draft too shy, borderline u."""
    g = torch.Generator().manual_seed(5)
    cases = []
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    cases += [(p, q, 1, 0.2), (p, q, 1, 0.5), (p, q, 1, 0.9),   # p/q = 1/3
              (p, q, 0, 0.99),                                   # p > q: always accepted
              (p, q, 2, 0.999)]                                  # p == q: always accepted
    for _ in range(6):
        pt = torch.softmax(torch.randn(12, generator=g) * 2, 0)
        pd = torch.softmax(torch.randn(12, generator=g) * 2, 0)
        token = int(torch.argmax(pd / pt))                       # where the draft over-proposes most
        ratio = float(pt[token] / pd[token])
        for u in (ratio * 0.5, ratio * 1.5 if ratio * 1.5 < 1 else 0.999):
            cases.append((pt, pd, token, float(u)))
    return cases


def check_accept_step(fn) -> None:
    """Check `fn(p_target, p_draft, token, u) -> (accepted, residual)`: residual is the
    normalized distribution to resample from after a rejection, or None when accepted.
    Notebook 05 (speculative decoding)."""
    for p, q, token, u in _cases():
        want_ok, want_res = reference_accept_step(p, q, token, u)
        try:
            got = fn(p.clone(), q.clone(), token, u)
            accepted, residual = got
        except (TypeError, ValueError):
            fail(ACCEPT, "a pair (accepted, residual)", repr(got)[:80],
                 "return two values, e.g. `return True, None` or `return False, residual`")
        accepted = bool(accepted)
        ratio = float(p[token] / q[token])
        if accepted != want_ok:
            hint = (f"with p_target[x] = {float(p[token]):.3f}, p_draft[x] = {float(q[token]):.3f} and "
                    f"u = {u:.3f}, the draft token is accepted when u < min(1, p_target[x] / p_draft[x]) "
                    f"= {min(1.0, ratio):.3f}.")
            if not accepted and ratio >= 1:
                hint += " When the target likes x at least as much as the draft, always accept."
            fail(ACCEPT, f"accepted={want_ok}", f"accepted={accepted}", hint)
        if want_ok:
            continue
        if residual is None:
            fail(ACCEPT, "the residual distribution after a rejection", "None",
                 "after a rejection return normalize(max(0, p_target - p_draft)).")
        residual = torch.as_tensor(residual, dtype=torch.float32)
        if residual.shape != p.shape or not torch.allclose(residual, want_res, atol=1e-5):
            unnormalized = (p - q).clamp_min(0)
            if residual.shape == p.shape and torch.allclose(residual, unnormalized, atol=1e-5):
                hint = "divide max(0, p_target - p_draft) by its sum so that it adds up to 1."
            elif residual.shape == p.shape and torch.allclose(residual, p, atol=1e-5):
                hint = ("resampling from p_target itself double-counts the mass the draft already "
                        "covered; use normalize(max(0, p_target - p_draft)).")
            else:
                hint = "residual = (p_target - p_draft).clamp_min(0), then divide by its sum."
            fail(ACCEPT, [round(v, 3) for v in want_res.tolist()][:6],
                 [round(v, 3) for v in residual.flatten().tolist()][:6], hint)
    passed(ACCEPT, "Accepting with min(1, p/q) and resampling from the residual gives exactly p_target.")


def check_expected_tokens(fn) -> None:
    """Check `fn(alpha, k) -> float`: (1 - alpha^(k+1)) / (1 - alpha), and k + 1 at alpha = 1.
    Notebook 05 (speculative decoding)."""
    cases = [(0.0, 4), (0.5, 1), (0.5, 4), (0.8, 4), (0.9, 8), (0.3, 2), (0.99, 5), (1.0, 4), (1.0, 1),
             (0.7, 0)]
    for alpha, k in cases:
        want = expected_tokens_per_call(alpha, k)
        try:
            got = fn(alpha, k)
        except ZeroDivisionError:
            fail(EXPECTED, f"{want} for alpha={alpha}, k={k}", "ZeroDivisionError",
                 "at alpha = 1 every draft is accepted: return k + 1 without dividing.")
        try:
            got = float(got)
        except (TypeError, ValueError):
            fail(EXPECTED, "a number", repr(got)[:60], "return a float")
        if not close_enough(got, want, rel=1e-6):
            if k > 0 and alpha < 1 and close_enough(got, (1 - alpha ** k) / (1 - alpha), 1e-6):
                hint = "a step always adds one token of the target's own, so the sum runs to alpha^k: use k + 1."
            elif alpha < 1 and close_enough(got, alpha * k + 1, 1e-6):
                hint = ("the i-th draft counts only if all before it were accepted too: "
                        "1 + alpha + alpha^2 + ... + alpha^k.")
            else:
                hint = "1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); k + 1 when alpha = 1."
            fail(EXPECTED, f"{want:.4f} for alpha={alpha}, k={k}", f"{got:.4f}", hint)
    passed(EXPECTED, "At alpha = 0.8 and k = 4 a target pass yields 3.36 tokens on average.")
