"""Choosing the next token from logits: greedy, temperature, top-k, top-p.

Introduced in notebook 01 (KV cache); notebook 05 (speculative decoding) needs
the full probability distribution, which `probabilities` gives.

Reproducibility: every sampling call takes a `torch.Generator`; `generate` seeds
one from `SamplingConfig.seed`, so the same seed gives the same tokens.

No value that passes `SamplingConfig`'s checks can make sampling raise (notebook 09: a
server must never let one request's numbers stop its engine): any whole seed >= 0 is
reduced modulo 2**64 (what `torch.Generator.manual_seed` takes); a temperature below
`GREEDY_BELOW` is greedy (vLLM's rule); logits are shifted by their maximum before the
division by the temperature, so that a small temperature cannot overflow to inf - inf;
top-p always keeps the most likely token; and a distribution that still holds NaN (the
model's own logits were NaN) is refused in one sentence instead of reaching
`torch.multinomial`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import LabError
from ..inputs import finite_number, whole_number

SEED_MODULUS = 2 ** 64      # torch.Generator.manual_seed takes [0, 2**64)
GREEDY_BELOW = 1e-5         # a temperature below this samples the argmax (as vLLM does)


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick tokens. temperature 0 (or below `GREEDY_BELOW`) means greedy (argmax); a
    seed is any whole number >= 0, reduced modulo 2**64 (the server reduces a negative one). Notebook 01 (KV cache); notebook 05
    (speculative decoding) samples with it; notebook 09's server builds one per request."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = 0

    def __post_init__(self):
        # each check goes through labsupport.inputs, whose range checks NaN cannot pass
        object.__setattr__(self, "temperature",
                           finite_number(self.temperature, "temperature (0 means greedy)", minimum=0))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", whole_number(self.top_k, "top_k (None disables it)"))
        if self.top_p is not None:
            object.__setattr__(self, "top_p", finite_number(self.top_p, "top_p (None disables it)",
                                                            minimum=0, maximum=1, above_minimum=True))
        if self.seed is not None:
            seed = whole_number(self.seed, "seed (None for a random one)", minimum=0)
            object.__setattr__(self, "seed", seed % SEED_MODULUS)

    @property
    def greedy(self) -> bool:
        """Whether this picks the argmax: temperature 0, or so small that it makes no difference
        worth a random draw (and whose division would overflow)."""
        return self.temperature < GREEDY_BELOW

    def generator(self, device) -> torch.Generator | None:
        if self.greedy or self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


GREEDY = SamplingConfig()


def require_sampling(sampling, what: str = "sampling") -> SamplingConfig:
    """The one check of a sampling argument, at each public entrance (`generate`,
    `speculative_generate`, `Request`, a draft's `start`): `sampling` itself, or one sentence.
    Notebook 01 (KV caching)."""
    if not isinstance(sampling, SamplingConfig):
        raise LabError(f"{what} must be a SamplingConfig (e.g. SamplingConfig(temperature=0.8, seed=0)), "
                       f"got {type(sampling).__name__}.")
    return sampling


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The distribution the sampler draws from: softmax(logits / T) restricted to
    the top-k tokens and the top-p nucleus, renormalized. logits: (..., vocab).
    Notebook 05 (speculative decoding). Safe for any checked `sampling` (see the module's
    docstring): the top token always survives, and NaN logits are refused in one sentence."""
    logits = logits.float()
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / max(sampling.temperature, GREEDY_BELOW)
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False                     # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    if bool(torch.isnan(probs).any()):
        raise LabError("The model's logits hold NaN, so no token can be sampled; check the model's "
                       "precision (fp16 overflow) or its weights.")
    return probs


def sample(logits: torch.Tensor, sampling: SamplingConfig = GREEDY,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token for each row: logits (batch, vocab) -> tokens (batch,). Notebook 01 (KV cache)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, sampling)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
