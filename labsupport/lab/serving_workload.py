"""Seeded workloads: when requests arrive and how long their answers are.

Introduced in notebook 06 (continuous batching).

Real traffic has two features that decide how well a scheduler does:

* arrivals are random: a Poisson process with `rate` requests per second (or per
  step, on the "steps" clock): the gaps between arrivals are exponential;
* answer lengths are long-tailed: most replies are short, a few are very long.
  Lengths here are log-normal (median `median_new_tokens`, spread `sigma`),
  clipped to [min_new_tokens, max_new_tokens].

Each request ignores end-of-sequence tokens and stops at its drawn length, as
serving benchmarks do (vLLM's `ignore_eos`), so that both policies produce
exactly the same tokens and a throughput comparison is fair.
"""

from __future__ import annotations

import numpy as np

from ..errors import LabError
from ..inputs import finite_number, whole_number
from ..engine.sampling import GREEDY, SamplingConfig
from ..engine.serving.request import Request

QUESTIONS = [
    "Why is the sky blue?",
    "Give me three tips for a good night's sleep.",
    "What is a transformer in machine learning?",
    "Write a haiku about autumn leaves.",
    "Explain what a black hole is to a child.",
    "How do vaccines work?",
    "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet.",
    "Why do cats purr?",
    "How does a refrigerator keep food cold?",
    "List five fruits that are rich in vitamin C.",
    "What causes the seasons on Earth?",
]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` prompts in the model's chat template, cycling through a few everyday questions.
    Notebook 06 (continuous batching)."""
    from ..engine.generation import chat_prompt
    return [tokenizer.encode(chat_prompt(tokenizer, QUESTIONS[i % len(QUESTIONS)]), add_special_tokens=False)
            for i in range(count)]


def output_lengths(count: int, median_new_tokens: float = 16, sigma: float = 1.0,
                   min_new_tokens: int = 2, max_new_tokens: int = 256, seed: int = 0) -> list[int]:
    """Long-tailed answer lengths: log-normal, clipped. Notebook 06 (continuous batching)."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(median_new_tokens), sigma, size=count)
    return np.clip(np.round(lengths), min_new_tokens, max_new_tokens).astype(int).tolist()


def arrival_times(count: int, rate: float | None, seed: int = 0) -> list[float]:
    """Poisson arrivals at `rate` per second (per step on the steps clock); None: all at once.
    Notebook 06 (continuous batching)."""
    if rate is None:
        return [0.0] * count
    rate = finite_number(rate, "The arrival rate (requests per second; None for all at once)",
                         minimum=0, above_minimum=True)
    rng = np.random.default_rng(seed + 1)
    return np.cumsum(rng.exponential(1.0 / rate, size=count)).tolist()


def make_workload(prompts: list[list[int]], count: int | None = None, rate: float | None = None,
                  median_new_tokens: float = 16, sigma: float = 1.0, min_new_tokens: int = 2,
                  max_new_tokens: int = 256, sampling: SamplingConfig = GREEDY,
                  seed: int = 0) -> list[Request]:
    """`count` requests (default: one per prompt, prompts reused in turn), seeded.
    Notebook 06 (continuous batching)."""
    if not prompts:
        raise LabError("make_workload needs at least one prompt.")
    count = whole_number(len(prompts) if count is None else count, "count (requests in the workload)")
    finite_number(median_new_tokens, "median_new_tokens", minimum=0, above_minimum=True)
    finite_number(sigma, "sigma (spread of the answer lengths)", minimum=0)
    min_new_tokens = whole_number(min_new_tokens, "min_new_tokens")
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens", minimum=min_new_tokens)
    seed = whole_number(seed, "seed", minimum=0)
    lengths = output_lengths(count, median_new_tokens, sigma, min_new_tokens, max_new_tokens, seed)
    arrivals = arrival_times(count, rate, seed)
    return [Request(prompt=prompts[i % len(prompts)], max_new_tokens=lengths[i], sampling=sampling,
                    eos_token_ids=(), arrival=arrivals[i], request_id=i)
            for i in range(count)]
