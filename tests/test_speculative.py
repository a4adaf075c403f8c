"""Speculative decoding (notebook 05): exact greedy output, exact sampling, stats, formulas.

The sampling tests are statistical. Each compares the empirical distribution of a
generated token with the target's exact distribution by a chi-square test whose
threshold is the 0.999 quantile of the chi-square distribution (Wilson-Hilferty
approximation): a correct sampler fails one such comparison with probability 1/1000
(the false-alarm rate). The seeds are fixed, so the outcome is reproducible.
Breaking the acceptance rule (always accepting the draft) makes them fail by far.
"""

import math

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import StaticKVCache
from labsupport.weights.fixtures import lively_model as lively
from labsupport.engine.models.transformer import Transformer
from labsupport.engine.sampling import GREEDY, SamplingConfig, probabilities
from labsupport.engine.speculative import (ModelDraft, PromptLookupDraft, QuantizedSelfDraft,
                                           speculative_generate)
from labsupport.lab.speculative_math import expected_speedup, expected_tokens_per_call


@pytest.fixture(scope="module")
def target():
    return lively()


@pytest.fixture
def one_thread():
    """The tiny models run fastest on one thread (two threads fight on a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROMPTS = [list(b"Hello world, hello world, hello"), list(b"The cat sat on the mat. The cat"), [65]]


# --- greedy: the same tokens as the target alone ---------------------------------------------

@pytest.mark.parametrize("draft_kind", ["other-family", "noisy-copy", "self", "prompt-lookup"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_greedy_generate(target, draft_kind, k, one_thread):
    draft = {"other-family": lambda: ModelDraft(lively("tiny-gpt2", seed=3)),
             "noisy-copy": lambda: ModelDraft(lively(noise=0.3)),
             "self": lambda: ModelDraft(target),
             "prompt-lookup": lambda: PromptLookupDraft(ngram=3)}[draft_kind]()
    for prompt in PROMPTS:
        expected = generate(target, prompt, 40, eos_token_ids=()).row(0)
        result = speculative_generate(target, draft, prompt, 40, k=k, eos_token_ids=(), trace=True)
        assert result.tokens == expected, (draft_kind, k, prompt)
        assert result.stats.tokens == 40
    if draft_kind == "self":
        assert result.stats.acceptance_rate == 1.0
        assert result.stats.tokens_per_call == pytest.approx(40 / math.ceil(40 / (k + 1)))


def test_end_token_stops_generation_and_is_kept(target, one_thread):
    plain = generate(target, PROMPTS[0], 30, eos_token_ids=()).row(0)
    eos = plain[12]                                    # pretend the 13th token ends the text
    result = speculative_generate(target, ModelDraft(target), PROMPTS[0], 30, k=4, eos_token_ids=(eos,))
    assert result.tokens == plain[: plain.index(eos) + 1]
    assert result.stats.tokens == len(result.tokens)


@pytest.mark.slow
def test_int4_self_draft_on_the_embedded_model(smollm):
    pytest.importorskip("labsupport.engine.quant", reason="labsupport.engine.quant (notebook 04) is not available")
    model, tokenizer = smollm
    ids = tokenizer.encode("Repeat after me: the quick brown fox jumps over the lazy dog.")
    draft = QuantizedSelfDraft(model, "int4", group_size=32)
    expected = generate(model, ids, 24, eos_token_ids=()).row(0)
    result = speculative_generate(model, draft, ids, 24, k=4, eos_token_ids=())
    assert result.tokens == expected
    assert result.stats.acceptance_rate > 0.5          # int4 of a Q4_1 checkpoint: nearly the same model
    assert model.lm_head.__class__.__name__ == "Linear"   # the target itself was not quantized


# --- sampling: exactly the target's distribution ---------------------------------------------

def chi2_quantile(df: int, p: float = 0.999) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.0902 for p = 0.999)."""
    z = {0.999: 3.090232}[p]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """Pearson's statistic, with the cells expected fewer than `min_expected` times pooled."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < min_expected
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


@torch.inference_mode()
def exact_first_two(model, prompt, sampling):
    """The exact marginal distributions of the first and the second generated token."""
    p1 = probabilities(model.logits(model(torch.tensor([prompt])), at=-1)[0], sampling)                 # (vocab,)
    vocab = p1.shape[0]
    both = torch.cat([torch.tensor([prompt]).expand(vocab, -1),
                      torch.arange(vocab).unsqueeze(1)], dim=1)                         # (vocab, T + 1)
    p2_given_1 = probabilities(model.logits(model(both), at=-1), sampling)              # (vocab, vocab)
    return p1, p1 @ p2_given_1


SAMPLES = 1500


def sample_counts(target, draft, prompt, sampling, k=2):
    vocab = target.config.vocab_size
    counts = torch.zeros(2, vocab, dtype=torch.long)
    accepted = drafted = 0
    for i in range(SAMPLES):
        config = SamplingConfig(temperature=sampling.temperature, seed=1000 + i)
        result = speculative_generate(target, draft, prompt, 3, k=k, sampling=config, eos_token_ids=())
        counts[0, result.tokens[0]] += 1
        counts[1, result.tokens[1]] += 1
        accepted += result.stats.accepted
        drafted += result.stats.drafted
    return counts, accepted / drafted


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_sampling_matches_the_target_distribution(target, temperature, one_thread):
    sampling = SamplingConfig(temperature=temperature)
    draft_model = lively(noise=0.05)                    # agrees with the target only partly
    prompt = PROMPTS[1]
    counts, acceptance = sample_counts(target, ModelDraft(draft_model), prompt, sampling)
    assert 0.1 < acceptance < 0.95                     # both the accept and the resample path are used
    for position, exact in enumerate(exact_first_two(target, prompt, sampling)):
        statistic, df = chi2_statistic(counts[position], exact)
        assert statistic < chi2_quantile(df), (position, statistic, df, chi2_quantile(df))


def test_sampling_with_a_point_mass_draft_is_exact(target, one_thread):
    """Prompt lookup proposes tokens with certainty: q is one-hot, accepted with probability p(d)."""
    sampling = SamplingConfig(temperature=1.0)
    prompt = list(b"abcabcab")
    counts, acceptance = sample_counts(target, PromptLookupDraft(ngram=2), prompt, sampling)
    assert acceptance < 1
    for position, exact in enumerate(exact_first_two(target, prompt, sampling)):
        statistic, df = chi2_statistic(counts[position], exact)
        assert statistic < chi2_quantile(df), (position, statistic, df, chi2_quantile(df))


def test_a_draft_gets_its_sampling_when_it_starts(target, one_thread):
    """The draft samples as the target does, each generation: speculative_generate hands it
    the sampling at start, nothing sets it from outside."""
    draft = ModelDraft(lively(noise=0.05))
    hot = SamplingConfig(temperature=1.5, seed=2)
    result = speculative_generate(target, draft, PROMPTS[0], 12, k=3, sampling=hot, eos_token_ids=())
    assert draft.sampling is hot and result.stats.drafted > 0
    draft.start(PROMPTS[0], 32, torch.Generator().manual_seed(0), hot)
    _, probs = draft.propose(PROMPTS[0], 2)
    assert probs is not None and probs.shape == (2, target.config.vocab_size)   # sampled: distributions
    speculative_generate(target, draft, PROMPTS[0], 12, k=3, eos_token_ids=())  # the same draft, reused greedy
    assert draft.sampling.greedy
    draft.start(PROMPTS[0], 32, None)
    assert draft.propose(PROMPTS[0], 2)[1] is None
    with pytest.raises(LabError, match="sampling must be a SamplingConfig"):
        draft.start(PROMPTS[0], 32, None, sampling=0.7)
    with pytest.raises(TypeError):
        ModelDraft(target, hot)                          # no sampling of its own to be given


def test_chi2_quantile_is_accurate():
    # reference values of the 0.999 quantile (tables): df 1 -> 10.83, 10 -> 29.59, 100 -> 149.4
    assert chi2_quantile(10) == pytest.approx(29.59, rel=0.01)
    assert chi2_quantile(100) == pytest.approx(149.45, rel=0.005)


def test_same_seed_same_sample(target, one_thread):
    sampling = SamplingConfig(temperature=1.0, seed=7)
    runs = [speculative_generate(target, ModelDraft(lively(noise=0.05)), PROMPTS[0], 20, k=3,
                                 sampling=sampling, eos_token_ids=()).tokens for _ in range(2)]
    assert runs[0] == runs[1]


# --- caches passed in ----------------------------------------------------------------------

def test_caches_passed_in_are_used(target, one_thread):
    prompt = PROMPTS[0]
    expected = generate(target, prompt, 20, eos_token_ids=()).row(0)
    made = []

    def factory(model, batch_size, max_len):
        made.append(max_len)
        return StaticKVCache.for_model(model, batch_size, max_len)

    cache = StaticKVCache.for_model(target, 1, len(prompt) + 20)
    result = speculative_generate(target, ModelDraft(lively(noise=0.3), cache_factory=factory), prompt, 20,
                                  k=3, eos_token_ids=(), cache=cache)
    assert result.tokens == expected
    assert made == [len(prompt) + 20] and cache.length > len(prompt)


def test_caches_that_do_not_fit_are_refused_in_one_sentence(target):
    too_short = ModelDraft(target, cache_factory=lambda m, b, n: StaticKVCache.for_model(m, b, n - 1))
    cases = [("rows", PromptLookupDraft(), StaticKVCache.for_model(target, 2, 64)),
             ("positions", too_short, None),
             ("must be a KV cache", PromptLookupDraft(), "a cache")]
    for words, draft, cache in cases:
        with pytest.raises(LabError, match=words) as error:
            speculative_generate(target, draft, PROMPTS[0], 8, cache=cache)
        assert "\n" not in str(error.value) and ". " not in str(error.value)
    with pytest.raises(LabError, match="cache_factory"):
        ModelDraft(target, cache_factory="static")


# --- refusals, formulas, bookkeeping ---------------------------------------------------------

def test_a_draft_with_another_vocabulary_is_refused(target):
    other = Transformer(target.config.with_(vocab_size=300, name="tiny-300")).eval()
    with pytest.raises(LabError, match="vocabulary") as error:
        speculative_generate(target, ModelDraft(other), PROMPTS[0], 8)
    assert "\n" not in str(error.value) and str(error.value).count(". ") == 0


def test_expected_tokens_and_speedup_formulas():
    assert expected_tokens_per_call(0.0, 4) == 1.0
    assert expected_tokens_per_call(1.0, 4) == 5.0
    assert expected_tokens_per_call(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_call(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    # alpha 0.8, k 4, c 0.05: 3.36 tokens per call for 1.2 target-step costs -> 2.80x
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(2.80, abs=0.01)
    assert expected_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)
    # a measured verify pass of 2 plain steps instead of Leviathan et al.'s free one (v = 1)
    assert expected_speedup(0.8, 4, 0.05, verify_cost=2.0) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 2.2))
    assert expected_speedup(0.8, 4, 0.05, verify_cost=1.0) == expected_speedup(0.8, 4, 0.05)
    with pytest.raises(LabError):
        expected_tokens_per_call(1.5, 4)
    with pytest.raises(LabError, match="verify_cost"):
        expected_speedup(0.8, 4, 0.05, verify_cost=0)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0, seed=3)])
def test_stats_add_up(target, sampling, one_thread):
    draft = ModelDraft(lively(noise=0.05))
    result = speculative_generate(target, draft, PROMPTS[1], 37, k=3, sampling=sampling,
                                  eos_token_ids=(), trace=True)
    s = result.stats
    assert s.accepted + s.replaced + s.bonus == len(result.tokens) == 37
    assert s.target_calls == len(result.trace)
    assert s.rejected == s.replaced                    # no end token: every miss is followed by a replacement
    assert 0 < s.accepted < s.drafted
    # greedy: the target's argmax corrects a miss, nothing is sampled; sampling: a residual draw
    replacement = "corrected" if sampling.greedy else "resampled"
    assert {step.extra_kind for step in result.trace} == {replacement, "bonus"}
    rebuilt = []
    for step in result.trace:
        assert step.statuses.count("accepted") == step.n_accepted
        assert step.statuses.count("rejected") == int(step.extra_kind == replacement)
        assert len(step.target_argmax) == len(step.drafted) + 1
        if sampling.greedy:                            # what the target added is its own choice there
            assert step.extra_token == step.target_argmax[step.n_accepted]
        rebuilt += step.drafted[: step.n_accepted] + [step.extra_token]
    assert rebuilt == result.tokens
    assert s.tokens_per_call == pytest.approx(37 / s.target_calls)


def test_prompt_lookup_copies_what_followed_the_last_ngram():
    draft = PromptLookupDraft(ngram=2)
    tokens, probs = draft.propose([5, 6, 7, 8, 9, 1, 6, 7], k=3)
    assert tokens == [8, 9, 1] and probs is None
    assert draft.propose([1, 2, 3], k=3) == ([], None)          # nothing to copy
    assert PromptLookupDraft(ngram=3, k=2).propose([4, 5, 6, 7, 4, 5, 6], k=5)[0] == [7, 4]


def test_stats_add_sums_every_count_and_time_in_place():
    """`SpeculativeStats.add`: notebook 07's speculative stage sums its requests' stats with it."""
    from labsupport.engine.speculative import SpeculativeStats
    total = SpeculativeStats()
    one = SpeculativeStats(drafted=8, accepted=5, rejected=2, replaced=2, bonus=1, target_calls=3,
                           draft_seconds=0.5, target_seconds=1.0, prefill_seconds=0.25)
    two = SpeculativeStats(drafted=4, accepted=1, rejected=1, replaced=1, bonus=0, target_calls=2, target_seconds=0.5)
    total.add(one)
    total.add(two)
    assert (total.drafted, total.accepted, total.rejected, total.target_calls) == (12, 6, 3, 5)
    assert total.tokens == one.tokens + two.tokens == 10 and total.target_seconds == 1.5
    assert total.alpha == 6 / 9 and one.drafted == 8                      # `other` left as it was
