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
from .workloads import CHAT_QUESTIONS, preset

QUESTIONS = CHAT_QUESTIONS                  # the chat questions of `workloads`, cycled through


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` prompts in the model's chat template, cycling through a few everyday questions.
    Notebook 06 (continuous batching)."""
    from ..weights.chat import chat_prompt
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


# --- the request workloads of notebooks 06 and 07 --------------------------------------------

def serving_workload(tokenizer, device, count: int | None = None, rate: float | None = None, seed: int = 0):
    """The course's long-tailed workload: chat prompts, log-normal answer lengths (median 16,
    sigma 1.0, at most 256 tokens); `count` requests, by default the device's preset
    (``serving_requests`` of `workloads.PRESETS`: 24 on a CPU, 256 on a GPU).

    Introduced in notebook 06 (continuous batching)."""
    if count is None:
        count = preset(device).serving_requests
    return make_workload(chat_prompts(tokenizer, count), rate=rate, median_new_tokens=16, sigma=1.0,
                         max_new_tokens=256, seed=seed)


def stack_workload(tokenizer, device, count: int | None = None, seed: int = 0):
    """The workload of notebook 07: chat requests, answer lengths log-normal (median 16,
    sigma 0.8, 4..64 tokens); `count` requests, by default the device's preset
    (``stack.requests`` of `workloads.PRESETS`: 8 on a CPU, 64 on a GPU).

    Introduced in notebook 07 (putting it together)."""
    if count is None:
        count = preset(device).stack.requests
    return make_workload(chat_prompts(tokenizer, count), median_new_tokens=16, sigma=0.8,
                         min_new_tokens=4, max_new_tokens=64, seed=seed)
