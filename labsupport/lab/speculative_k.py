"""Notebook 05's measured extras: the cost of a verify pass for each k, the expected speedup
against k (Leviathan et al. 2023, section 3.4: the optimal k), what this model's origin means for
an int4 self-draft, and where speculation lost on this machine.

Introduced in notebook 05 (speculative decoding). The formulas are in speculative_math.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.kv_cache import StaticKVCache
from ..errors import LabError
from .measure import captured, time_side_by_side
from .prose import weights_origin
from .speculative_math import expected_tokens_per_call, pass_costs


@torch.inference_mode()
def verify_pass_seconds(model, prompt: list[int], ks=range(0, 9), repeats: int = 5) -> dict[int, float]:
    """The time of the target's pass over k + 1 tokens (logits included) from a cache holding
    `prompt`, for each k, the median of `repeats` rounds that time every k in turn.
    Notebook 05 (speculative decoding). On a GPU each k's pass is a replayed CUDA graph
    (`measure.captured`; the pass rolls its cache back itself), else a LabError."""
    ks = sorted(set(int(k) for k in ks) | {0})
    if ks[0] < 0 or len(prompt) < 2:
        raise LabError("verify_pass_seconds needs k >= 0 and a prompt of at least 2 tokens.")
    cache = StaticKVCache.for_model(model, 1, len(prompt) + ks[-1] + 1)
    model(torch.tensor([prompt], device=model.device), cache=cache)              # the context, once
    start = cache.length
    fed = torch.tensor([prompt[-1:] * (ks[-1] + 1)], device=model.device)      # (1, k_max + 1)

    def verify(k: int):
        def one_pass():
            model.logits(model(fed[:, : k + 1], cache=cache))
            cache.truncate(start)                      # every pass starts from the same context
        return one_pass

    # Side by side (notebook 00): each round runs every k, the first k rotating, so a slow
    # moment of the machine lands on every k alike.
    passes = {k: captured(verify(k), model.device, f"the {k + 1}-token verify pass") for k in ks}
    timings = time_side_by_side(passes, model.device, warmup=1, repeats=repeats)
    return {k: t.median for k, t in timings.items()}


@dataclass(frozen=True)
class KCurve:
    """Expected speedup for each k (notebook 05): alpha, c, the measured v(k) and the best k."""

    alpha: float
    draft_per_token: float
    verify: dict[int, float]
    speedup: dict[int, float]

    @property
    def best_k(self) -> int:
        return max(self.speedup, key=self.speedup.get)


def k_curve(alpha: float, draft_per_token: float, verify_seconds: dict[int, float],
            plain_step_seconds: float) -> KCurve:
    """Leviathan et al.'s expected speedup E(alpha, k) / (k c + v(k)) for each k of
    `verify_seconds` (`verify_pass_seconds`), v(k) in plain decode steps of `plain_step_seconds`,
    with a measured alpha and c (`pass_costs`). Notebook 05 (speculative decoding)."""
    if not plain_step_seconds > 0:
        raise LabError(f"plain_step_seconds must be a time above 0, got {plain_step_seconds}.")
    alpha = min(max(float(alpha), 0.0), 1.0)
    verify = {k: t / plain_step_seconds for k, t in verify_seconds.items()}
    speedup = {k: expected_tokens_per_call(alpha, k) / (k * draft_per_token + v) for k, v in verify.items()}
    return KCurve(alpha, draft_per_token, dict(verify), speedup)


def weights_were_4bit(config) -> bool:
    """True where the model was read from a 4-bit GGUF file (the embedded model's Q4_1: its weights
    sit on a 4-bit grid in blocks of 32; `prose.weights_origin`). Hub checkpoints arrive in 16 or
    32 bits. Notebook 05."""
    return weights_origin(getattr(config, "name", "")).was_4bit


def self_draft_origin_note(config, error_32: float, random_error_32: float) -> str:
    """What an int4 self-draft's acceptance says about this model, from where its weights came
    from and the measured int4 errors (groups of 32) on one of its matrices and on a random one.
    Notebook 05 (speculative decoding)."""
    measured = (f"int4 in groups of 32 reproduces one of its matrices with a relative error of {error_32:.2%}, "
                f"a random matrix of the same shape with {random_error_32:.2%}")
    if weights_were_4bit(config):
        stored = weights_origin(config.name).stored
        return (f"**{config.name} is a special case.** It reached the course as a {stored} GGUF file (notebook 04, "
                f"section 3): its weights already sit on a 4-bit grid in blocks of 32, so int4 with groups of 32 "
                f"finds the same grid again ({measured}). Read the self-draft's acceptance as a property of this "
                f"4-bit-born model, not of int4 drafts in general: a model shipped in 16 bits loses about what the "
                f"random matrix loses, and its int4 copy disagrees with it more often.")
    return (f"**{config.name} was not stored in 4 bits** ({weights_origin(config.name).stored}), so int4 is an approximation of it "
            f"({measured}). The self-draft's acceptance above is what int4 costs a model of this kind; the "
            f"course's default model, read from a 4-bit GGUF file, would show a near-perfect int4 copy instead.")


def summary_origin_line(config) -> str:
    """The summary's line on the int4 self-draft, for this model's origin. Notebook 05."""
    if weights_were_4bit(config):
        stored = weights_origin(config.name).stored
        return (f"{config.name}'s int4 copy is a special case: the model was 4-bit before ({stored}), so int4 with "
                f"groups of 32 finds its grid again and the self-draft agrees with it unusually often.")
    return (f"{config.name} arrived as {weights_origin(config.name).stored}, not in 4 bits, so its int4 copy is an approximation and its acceptance "
            f"is what a self-draft usually gets.")


def where_it_loses(runs: dict, drafts, k: int, hf_ratio: float | None = None) -> list[str]:
    """One line per place where speculation did not pay in this run, with the measured reason:
    runs: {task: notebook 05's `measure` run}. Notebook 05 (speculative decoding)."""
    lines = []
    for task, run in runs.items():
        plain = run["timings"]["plain"].median
        for name in drafts:
            s, speedup = run["stats"][name], plain / run["timings"][name].median
            costs = pass_costs(s, run["plain_step_s"])
            step_cost = costs.draft_per_pass + costs.verify_per_pass
            if speedup >= 1 and s.tokens_per_call >= step_cost:
                continue
            reasons = []            # one short sentence each
            if s.tokens_per_call < 1.5:
                reasons.append(f"Few drafts were accepted (acceptance {s.acceptance_rate:.2f}).")
            if costs.verify_per_pass > 1.5:
                reasons.append(f"The verify pass over up to {k + 1} tokens cost {costs.verify_per_pass:.2f} plain "
                               "steps, not 1.")
            if costs.draft_per_pass > 0.5:
                reasons.append(f"Drafting cost {costs.draft_per_pass:.2f} plain steps per pass.")
            lines.append(" ".join([f"{name}, {task} task: {speedup:.2f}x over plain decoding.",
                                   f"A pass yielded {s.tokens_per_call:.2f} tokens for {step_cost:.2f} plain steps "
                                   "of work.", *reasons]))
    if hf_ratio is not None and hf_ratio < 1:
        lines.append(f"ours ran at {hf_ratio:.2f}x the speed of Hugging Face's prompt lookup on the grounded task.")
    return lines
