"""Speculative decoding on paper: the expected tokens per target call, the speed-up, the
costs of a pass, and the distribution the accept/resample rule produces.

Introduced in notebook 05 (speculative decoding); the engine's loop is in
engine/speculative.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import LabError
from ..engine.speculative import SpeculativeStats


def expected_tokens_per_call(alpha: float, k: int) -> float:
    """Mean tokens per target pass when each drafted token is accepted with probability
    alpha: 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023).
    Notebook 05 (speculative decoding)."""
    if not 0 <= alpha <= 1:
        raise LabError(f"alpha is an acceptance rate, between 0 and 1; got {alpha}.")
    if k < 0:
        raise LabError(f"k (tokens drafted per step) must be at least 0, got {k}.")
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_tokens_per_pass(alphas) -> float:
    """Mean tokens per target pass when draft i is accepted with probability alphas[i - 1]
    given that drafts 1..i-1 were: 1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 ... alpha_k
    (with one alpha for all, `expected_tokens_per_call`). Notebook 05 (speculative decoding)."""
    total, reached = 1.0, 1.0
    for alpha in alphas:
        if not 0 <= alpha <= 1:
            raise LabError(f"each rate in alphas is a probability, between 0 and 1; got {alpha}.")
        reached *= alpha                                  # drafts 1..i all accepted
        total += reached
    return total


def expected_speedup(alpha: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup over plain decoding: (1 - alpha^(k+1)) / ((1 - alpha)(k c + v)),
    c = cost of one draft step / cost of one plain decode step, v = cost of the target's
    pass over k + 1 tokens / cost of one plain decode step.

    Introduced in notebook 05 (speculative decoding). Leviathan et al. 2023 (Theorem 3.8)
    take v = 1, the default: a memory-bound pass over k + 1 tokens costing as much as
    over one. Pass the measured v (`pass_costs`) to predict what this machine will do.
    """
    if cost_ratio < 0:
        raise LabError(f"cost_ratio (draft step time / target step time) must be >= 0, got {cost_ratio}.")
    if not verify_cost > 0:
        raise LabError(f"verify_cost (target pass time / plain step time) must be > 0, got {verify_cost}.")
    return expected_tokens_per_call(alpha, k) / (k * cost_ratio + verify_cost)


@dataclass(frozen=True)
class PassCosts:
    """What one speculative step cost, in plain decode steps (notebook 05).

    draft_per_token: one drafted token (c); draft_per_pass: all the drafting of one step;
    verify_per_pass: the target's pass over [pending, d_1..d_k] (v; Leviathan et al. assume 1)."""

    draft_per_token: float
    draft_per_pass: float
    verify_per_pass: float

    @property
    def larger(self) -> str:
        """"the verify pass" or "the draft": which takes more of a step's time."""
        return "the verify pass" if self.verify_per_pass >= self.draft_per_pass else "the draft"


def pass_costs(stats: SpeculativeStats, plain_step_seconds: float) -> PassCosts:
    """The measured costs of a speculative run in plain decode steps: `stats` from
    `speculative_generate`, `plain_step_seconds` the time of one decode step of plain
    generation on the same machine (`GenerationResult.decode_seconds` / its decode steps).
    Notebook 05 (speculative decoding)."""
    if not plain_step_seconds > 0:
        raise LabError(f"plain_step_seconds must be a time above 0, got {plain_step_seconds}.")
    if stats.target_calls == 0:
        raise LabError("These stats hold no target pass; generate at least one token first.")
    per_call = stats.target_calls * plain_step_seconds
    per_token = stats.draft_seconds / stats.drafted / plain_step_seconds if stats.drafted else 0.0
    return PassCosts(per_token, stats.draft_seconds / per_call, stats.target_seconds / per_call)


def speculative_token_distribution(p: torch.Tensor, q: torch.Tensor, resample_from: str = "residual") -> torch.Tensor:
    """The exact distribution of the token one speculative position emits, when the draft
    samples d from q and the target accepts it with probability min(1, p(d) / q(d)).

    Introduced in notebook 05 (speculative decoding). p, q: (vocab,) distributions.
    resample_from: "residual" (the rule: normalize(max(0, p - q))) or "target" (the
    tempting mistake: draw the replacement from p itself). The first gives back p exactly.
    """
    if resample_from not in ("residual", "target"):
        raise LabError(f"resample_from is 'residual' or 'target', got {resample_from!r}.")
    kept = torch.minimum(p, q)                        # q(x) min(1, p(x)/q(x)): x drafted and accepted
    rejected = 1 - kept.sum()                         # the chance that the drafted token is rejected
    residual = (p - q).clamp_min(0) if resample_from == "residual" else p
    if residual.sum() <= 0:                           # p == q: nothing is ever rejected
        return kept
    return kept + rejected * residual / residual.sum()
