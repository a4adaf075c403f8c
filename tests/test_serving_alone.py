"""The serving engine's invariant (notebooks 06 and 06b): every request gets the tokens it gets alone.

One test, over every setting that can break it: both named policies and two custom ones, tight
caches that force preemption, token budgets that chunk prompts (4, 5, 6, 7, 64 tokens), prefix
caching with a shared system prompt, sampled requests, and 20 random mixes of all of these. In
each: the tokens equal `generate` alone, nothing is rejected, no block leaks, no pass computes
more than the budget and the step records say what ran (where a budget makes a step one pass), and no shared block is ever written. Tiny
models run in float64, where batching cannot flip an argmax by rounding, so equality is exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import Engine, Request
from labsupport.lab.serving_metrics import summarize
from labsupport.lab.serving_workload import make_workload
from serving_reference import (DrainThenRefill, ShortestPromptFirst, alone, chat_like, counting_forward, prompts,
                               step_tokens, watch_shared_writes)

SAMPLED = SamplingConfig(temperature=1.0, top_k=20, seed=5)
LONG_PROMPTS = dict(n=8, lengths=(5, 9, 3, 23, 7, 4, 17, 6))      # two prompts longer than a small budget


@dataclass
class Setting:
    """One case: how to make its requests, the engine's options, and what the case must show."""
    requests: list = field(repr=False)
    engine: dict = field(default_factory=dict)
    preempts: bool = False                    # a tight cache must have forced preemptions
    shares_prefix: bool = False               # most requests must reuse the cached system prompt


def policies_and_preemption() -> dict[str, Setting]:
    """Both named policies, with and without a cache small enough to preempt."""
    cases = {}
    for policy in ("static", "continuous"):
        for cache_tokens in (None, 48):
            requests = make_workload(prompts(6), count=10, rate=0.5, median_new_tokens=10, max_new_tokens=30, seed=3)
            cases[f"{policy}-cache{cache_tokens}"] = Setting(
                requests, dict(policy=policy, cache_tokens=cache_tokens),
                preempts=cache_tokens is not None and policy == "continuous")
    return cases


def chunked_prefill() -> dict[str, Setting]:
    """Token budgets that split prompts into chunks, with both policies and tight caches."""
    cases = {}
    for policy in ("continuous", "static"):
        for token_budget in (4, 7, 64):
            for cache_tokens in (None, 48):
                requests = make_workload(prompts(**LONG_PROMPTS), count=10, rate=0.5, median_new_tokens=10,
                                         max_new_tokens=24, seed=3)
                cases[f"chunked-{policy}-budget{token_budget}-cache{cache_tokens}"] = Setting(
                    requests, dict(policy=policy, cache_tokens=cache_tokens, token_budget=token_budget),
                    preempts=cache_tokens is not None and policy == "continuous")
    requests = make_workload(prompts(**LONG_PROMPTS), count=8, median_new_tokens=12, max_new_tokens=24, seed=3,
                             sampling=SAMPLED)
    cases["chunked-sampled-preempted"] = Setting(requests, dict(cache_tokens=48, token_budget=6), preempts=True)
    return cases


def prefix_caching() -> dict[str, Setting]:
    """A shared system prompt, cached, under chunking, preemption and sampling."""
    cases = {}
    for token_budget in (None, 5):
        for cache_tokens in (None, 56):
            for sampled in (False, True):
                extra = {"sampling": SAMPLED} if sampled else {}
                requests = make_workload(chat_like(), count=12, rate=0.7, median_new_tokens=10, max_new_tokens=24,
                                         seed=3, **extra)
                name = f"prefix-budget{token_budget}-cache{cache_tokens}-{'sampled' if sampled else 'greedy'}"
                cases[name] = Setting(requests, dict(cache_tokens=cache_tokens, token_budget=token_budget,
                                                     prefix_caching=True),
                                      preempts=cache_tokens is not None, shares_prefix=True)
    return cases


def random_mix(seed: int) -> Setting:
    """Random policies (named and custom), slots, budgets, block sizes, prompt lengths, arrivals,
    cache sizes (tight ones preempt) and prefix caching."""
    rng = random.Random(seed)
    slots = rng.randint(1, 4)
    block_size = rng.choice([2, 4])
    head = [rng.randrange(256) for _ in range(rng.choice([0, 0, 5, 9]))]     # a shared system prompt, or none
    heads_and_tails = [head + [rng.randrange(256) for _ in range(rng.randint(1, 16))] for _ in range(rng.randint(1, 7))]
    requests = [Request(p, max_new_tokens=rng.randint(1, 8), arrival=rng.choice([0, 0, 1, 3, 6]), request_id=i)
                for i, p in enumerate(heads_and_tails)]
    longest = max(r.max_length for r in requests)
    policy = rng.choice(["static", "continuous", "static", DrainThenRefill(), ShortestPromptFirst()])
    return Setting(requests, dict(max_slots=slots, policy=policy, block_size=block_size,
                                  token_budget=rng.randint(slots, slots + 10),
                                  cache_tokens=rng.choice([None, longest, longest, longest + block_size]),
                                  prefix_caching=rng.choice([False, True])))


SETTINGS = {**policies_and_preemption(), **chunked_prefill(), **prefix_caching(),
            **{f"random-{seed}": random_mix(seed) for seed in range(20)}}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_request_gets_the_tokens_it_gets_alone(tiny_model_f64, monkeypatch, name):
    setting = SETTINGS[name]
    options = dict(max_slots=4, block_size=4) | setting.engine
    computed = counting_forward(monkeypatch)
    watched = watch_shared_writes(monkeypatch)                          # shared blocks are never written
    engine = Engine(tiny_model_f64, **options)
    watched.append(engine)
    result = engine.run(setting.requests, clock="steps")

    assert not result.rejected
    assert result.tokens() == {r.request_id: alone(tiny_model_f64, r) for r in setting.requests}, options
    engine.blocks.assert_no_leaks()                                     # refcounts back to zero, cached blocks too
    if options.get("token_budget") is not None:                         # one forward pass a step
        assert computed == [step_tokens(s) for s in result.steps]       # the records say what ran
        assert max(computed) <= options["token_budget"]
    metrics = summarize(result)
    if setting.preempts:
        assert metrics["preemptions"] > 0                               # the tight cache did preempt
    if setting.shares_prefix:
        assert metrics["prefix_cached_tokens"] >= len(setting.requests) * 8 * 0.5
        assert metrics["prefill_tokens_computed"] + metrics["prefix_cached_tokens"] >= \
            sum(len(r.prompt) for r in setting.requests)


def test_the_settings_cover_what_can_break_the_invariant():
    """The cases hold every kind of setting, so a change to the list cannot silently drop one."""
    engines = [s.engine for s in SETTINGS.values()]
    assert {str(e.get("policy")) for e in engines} >= {"static", "continuous"}
    assert any(isinstance(e.get("policy"), DrainThenRefill) for e in engines)
    assert any(isinstance(e.get("policy"), ShortestPromptFirst) for e in engines)
    assert sum(s.preempts for s in SETTINGS.values()) >= 8
    assert sum(s.shares_prefix for s in SETTINGS.values()) >= 8
    assert any(e.get("token_budget") == 4 for e in engines) and any(e.get("prefix_caching") for e in engines)
    assert any(r.sampling is not None and r.sampling.temperature > 0 for s in SETTINGS.values() for r in s.requests)
