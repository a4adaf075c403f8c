"""Speculative decoding: a cheap draft guesses, the target checks k guesses in one pass.

Introduced in notebook 05 (speculative decoding).

At batch 1 a decode step is limited by reading the weights (notebook 00), so
scoring k + 1 tokens in one forward pass costs little more than scoring one.
Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling") turns that spare arithmetic into tokens:

1. a cheap *draft* proposes k tokens d_1..d_k, with its probabilities q_i;
2. the *target* runs once over [last token, d_1..d_k] and gets k + 1
   next-token distributions p_0..p_k from its KV cache;
3. d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first
   rejection a replacement token is drawn from normalize(max(0, p_i - q_i)) (not
   from p_i itself) and the step ends; if all k are accepted a bonus token is
   sampled from p_k;
4. both KV caches are rolled back past the rejected tokens (`truncate`).

Every step yields between 1 and k + 1 tokens for one target pass, and the
tokens are distributed *exactly* as if sampled from the target alone: the
acceptance rule plus the residual distribution add up to p_i (the proof is one
line per case in both papers; tests/test_speculative.py checks it with a
chi-square test). Greedy decoding is temperature 0: accept while the target's
argmax equals the draft token; at the first miss nothing is sampled, the target's
argmax *corrects* the draft token; after k matches its argmax is the bonus token.

Drafts (all behind one small interface, `Draft`; they live in drafts.py and are
exported here too, with the rest of the technique):

* `ModelDraft`: any causal LM with the target's tokenizer, with its own KV cache;
* `QuantizedSelfDraft`: the target's own int4 (or int8) copy (notebook 04);
* `PromptLookupDraft`: no model at all; copy what followed the last n tokens
  earlier in the context (prompt-lookup decoding, Saxena 2023). It pays when the
  answer quotes the prompt (summaries, edits, code changes), not in free text.

If a fraction alpha of the drafted tokens is accepted (independently), a step
yields (1 - alpha^(k+1)) / (1 - alpha) tokens on average, and with a draft step
costing c target steps the speedup is that over (k c + 1) (Leviathan et al.).
That "+ 1" assumes the target's pass over k + 1 tokens costs one plain decode
step; `pass_costs` (lab/speculative_math.py, with the other formulas) measures what it really costs (v plain steps), and
`expected_speedup(..., verify_cost=v)` divides by (k c + v) instead.

On a GPU a small model's step is bound by launching its kernels, not by reading the weights,
so `speculative_generate(..., compile=True)` runs both sides as replayed CUDA graphs, as
`generate(..., compile=True)` does (compiled.py, notebook 07): a model draft's one-token steps
are the compiled decode step, and every verify pass is one fixed-shape step of k + 1 tokens
(`CompiledDecoder.verify`), shorter passes (the last ones, or a prompt lookup that found fewer
than k tokens) padded up to k + 1: the padding sits after the real tokens, so the causal mask
hides it from them, and the rollback forgets it. The result says what ran (`decode_path`).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .compiled import CompiledDecoder, DecodePath, ReportsDecodePath, graphs_compiled, recompiled, slowest
from .drafts import Draft, ModelDraft, PromptLookupDraft, QuantizedSelfDraft, quantized_copy
from ..errors import LabError
from .generation import choose_decoder, require_fits_context
from ..inputs import token_id_set, token_rows, whole_number
from .hardware import synchronize
from .kv_cache import KVCache, StaticKVCache, require_fitting_cache
from .sampling import GREEDY, SamplingConfig, probabilities, require_sampling

__all__ = ["Draft", "ModelDraft", "QuantizedSelfDraft",
           "quantized_copy", "PromptLookupDraft", "SpeculativeStep", "SpeculativeStats", "SpeculativeResult",
           "require_compatible_draft", "verify", "speculative_generate"]


# --- the generation loop -----------------------------------------------------------------

REPLACEMENT_KINDS = ("corrected", "resampled")      # greedy: the target's argmax; sampling: a residual draw


@dataclass
class SpeculativeStep:
    """One target pass: what was drafted, how much of it the target kept, and the token
    the target added itself: "corrected" (greedy: its argmax in place of the first miss),
    "resampled" (sampling: drawn from the residual in place of the first miss) or "bonus"
    (after k matches). Notebook 05 (speculative decoding)."""

    drafted: list[int]
    n_accepted: int
    extra_token: int | None              # None when an end token among the drafts ended generation
    extra_kind: str | None               # "corrected", "resampled", "bonus" or None
    target_argmax: list[int] | None = None   # the target's own choice at each of the k + 1 positions

    @property
    def statuses(self) -> list[str]:
        """Per drafted token: "accepted", "rejected" (the first miss) or "unchecked" (after it)."""
        out = ["accepted"] * self.n_accepted
        if self.n_accepted < len(self.drafted):
            out.append("rejected" if self.extra_kind in REPLACEMENT_KINDS else "unchecked")
        return out + ["unchecked"] * (len(self.drafted) - len(out))


@dataclass
class SpeculativeStats:
    """Counts and times of one speculative generation (notebook 05). Every new token is
    an accepted draft, a replacement or a bonus token, so those three add up."""

    drafted: int = 0                     # tokens proposed by the draft
    accepted: int = 0                    # drafted tokens kept
    rejected: int = 0                    # first misses (each ends a step)
    replaced: int = 0                    # tokens the target put in place of a miss (greedy: its argmax)
    bonus: int = 0                       # tokens the target added after all drafts passed
    target_calls: int = 0                # verification passes (the prompt's prefill not counted)
    draft_seconds: float = 0.0           # drafting during the steps (a model draft's prefill not counted)
    target_seconds: float = 0.0          # the target's verification passes
    prefill_seconds: float = 0.0         # the prompt, through the target and a model draft

    @property
    def tokens(self) -> int:
        return self.accepted + self.replaced + self.bonus

    def count(self, drafted: list[int], n: int, kept: list[int], kind: str, draft_seconds: float,
              target_seconds: float) -> tuple[int, bool]:
        """Add one target pass that accepted `n` of `drafted` and kept `kept` (an end token may have
        cut it); returns (drafts kept, whether the target's extra token was kept)."""
        n_kept, extra_kept = min(n, len(kept)), len(kept) > n
        replaced = kind in REPLACEMENT_KINDS and extra_kept
        self.drafted += len(drafted)
        self.accepted += n_kept
        self.rejected += int(replaced and n < len(drafted))
        self.replaced += int(replaced)
        self.bonus += int(kind == "bonus" and extra_kept)
        self.target_calls += 1
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds
        return n_kept, extra_kept

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens that were kept (vLLM's definition)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def alpha(self) -> float:
        """Fraction of *checked* drafts that passed: the alpha of `expected_tokens_per_call`."""
        checked = self.accepted + self.rejected
        return self.accepted / checked if checked else float("nan")

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else float("nan")

    def add(self, other: "SpeculativeStats") -> None:
        """Add `other`'s counts and times to these, in place: the stats of several generations summed
        (notebook 07's speculative stage, over every request it served)."""
        for name, value in other.__dict__.items():
            setattr(self, name, getattr(self, name) + value)

    def to_dict(self) -> dict:
        return {**self.__dict__, "tokens": self.tokens, "acceptance_rate": self.acceptance_rate,
                "alpha": self.alpha, "tokens_per_target_call": self.tokens_per_call}


@dataclass
class SpeculativeResult(ReportsDecodePath):
    """What `speculative_generate` returns (notebook 05): the new tokens, the stats and,
    when asked for, the per-step trace."""

    tokens: list[int]                    # the new tokens (up to and including an end token)
    prompt_length: int
    stats: SpeculativeStats
    trace: list[SpeculativeStep] | None = field(default=None, repr=False)
    seconds: float = 0.0
    # what the steps ran on, as `GenerationResult` says it: path (read as decode_path, ...) is the
    # slower of the draft's steps (draft_path; None for a draft without a model) and the target's
    # verify passes (verify_path): "eager", "compiled" or "compiled + CUDA graphs"; the warm-up
    # (compiling, recording) never counts in `seconds`; decode_note: why a fast path asked for was
    # not taken (also a warning), or None
    path: DecodePath = field(default_factory=DecodePath)
    verify_path: str = "eager"
    draft_path: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("nan")


def require_compatible_draft(target, draft: Draft) -> None:
    """Refuse a draft whose token ids mean something else than the target's (notebook 05)."""
    vocab = target.config.vocab_size
    if draft.vocab_size is not None and draft.vocab_size != vocab:
        raise LabError(f"The draft has a vocabulary of {draft.vocab_size} tokens and the target "
                       f"{vocab}; a draft must share the target's tokenizer.")


def verify(target_probs: torch.Tensor | None, target_argmax: torch.Tensor, drafted: list[int],
           draft_probs: torch.Tensor | None, generator: torch.Generator | None) -> tuple[int, int, str]:
    """The acceptance rule. target_probs: (k+1, vocab) or None for greedy; target_argmax: (k+1,).
    Returns (tokens accepted n, the token the target adds, its kind: "corrected" (greedy:
    the target's argmax replaces the first miss, nothing is sampled), "resampled" (drawn
    from the residual) or "bonus"). Notebook 05 (speculative decoding). Greedy, the argmaxes
    come to the host in one transfer (`tolist`), not one wait for the GPU per token; sampled,
    p(d) and q(d) of every draft come in one, and each uniform as it is drawn (the seed's stream)."""
    if target_probs is None:                                             # greedy: exact match
        argmax = target_argmax.tolist()                                  # (k + 1,): the step's one transfer
        n = next((i for i, d in enumerate(drafted) if argmax[i] != d), len(drafted))
        return n, argmax[n], "corrected" if n < len(drafted) else "bonus"
    index = torch.arange(len(drafted), device=target_probs.device)
    ids = torch.tensor(drafted, dtype=torch.long, device=target_probs.device)
    p_d = target_probs[index, ids].tolist()                              # (k,): p(d_i), one transfer
    q_d = draft_probs[index, ids].tolist() if draft_probs is not None else [1.0] * len(drafted)  # point mass: 1
    for i, d in enumerate(drafted):
        p = target_probs[i]                                              # (vocab,)
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_d[i] < p_d[i]:                                          # accept with prob min(1, p/q)
            continue
        if draft_probs is not None:
            residual = (p - draft_probs[i]).clamp_min(0)                  # normalize(max(0, p - q))
        else:
            residual = p.clone()                                          # max(0, p - onehot(d)): p without d
            residual[d] = 0
        residual = residual if residual.sum() > 0 else p                  # p == q: only rounding gets here
        token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return i, token, "resampled"
    k = len(drafted)
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator)), "bonus"


def _verify_pass(target, decoder: CompiledDecoder | None, cache: KVCache | None, k: int,
                 max_len: int) -> tuple[KVCache, Callable[[list[int]], torch.Tensor], DecodePath]:
    """The target's cache, its verify pass (ids [pending, d_1..d_j], j <= k -> their logits
    (j + 1, vocab), the cache moved on by j + 1) and what the pass runs on, warmed up before
    anything is timed. Compiled: one fixed-shape step of k + 1 tokens, a shorter pass padded
    with copies of its last token, which no real token sees (causal mask) and the rollback
    forgets. Notebook 05 (speculative decoding)."""
    device, width = target.device, k + 1
    padded = max_len + k - 1          # the last pass starts at max_len - 2 at most and writes k + 1 slots
    path = DecodePath()
    if decoder is not None and cache is not None and cache.max_len < padded:
        raise LabError(f"A compiled verify pass always writes k + 1 = {width} slots, so the cache needs {padded} "
                       f"positions, {k - 1} more than the generation, and holds {cache.max_len}; pass a longer "
                       f"cache, or compile=False.")
    if decoder is not None and cache is None and padded > target.config.max_position:
        path = DecodePath(note=f"The compiled verify pass is padded to k + 1 = {width} tokens and would need "
                               f"{padded} positions, past the model's context of {target.config.max_position}; "
                               f"verifying without it.")
        warnings.warn(path.note, stacklevel=3)
        decoder = None
    if cache is None:
        cache = (decoder.cache_for(target, 1, padded, purpose="verify") if decoder is not None
                 else StaticKVCache.for_model(target, 1, max_len))
    if decoder is not None:
        path = decoder.warm_up(target, cache, width=width)
    if not path.compiled:
        def eager(fed: list[int]) -> torch.Tensor:
            return target.logits(target(torch.tensor([fed], device=device), cache=cache))[0]     # (j + 1, vocab)
        return cache, eager, path
    key_mask = torch.ones(1, cache.max_len, dtype=torch.bool, device=device)    # (1, max_len): a batch of one

    def compiled(fed: list[int]) -> torch.Tensor:
        start = cache.length
        tokens = torch.tensor([fed + fed[-1:] * (width - len(fed))], device=device)           # (1, k + 1)
        positions = torch.arange(start, start + width, device=device)[None]                   # (1, k + 1)
        return decoder.verify(target, cache, tokens, positions, key_mask)[0, : len(fed)]      # (j + 1, vocab)
    return cache, compiled, path


@torch.inference_mode()
def speculative_generate(target, draft: Draft, prompt, max_new_tokens: int = 32, k: int = 4,
                         sampling: SamplingConfig = GREEDY, eos_token_ids: Sequence[int] | None = None,
                         trace: bool = False, cache: KVCache | None = None,
                         compile: bool | CompiledDecoder | None = False) -> SpeculativeResult:
    """Generate from `target` with speculative decoding (batch 1); exact for any sampling.

    Introduced in notebook 05 (speculative decoding); Leviathan et al. 2023, Chen et al. 2023.

    prompt: a list or 1-D tensor of token ids. k: tokens drafted per step.
    eos_token_ids: ids that end generation (default: the target's; () never stops).
    trace: keep a `SpeculativeStep` per target pass (for the notebook's coloured trace).
    cache: the target's cache, an empty `KVCache` of one row and at least prompt +
        max_new_tokens positions (checked); default a new `StaticKVCache` of that size.
        (A `ModelDraft` makes its own, with its `cache_factory`.)
    compile: as `generate`'s (True: `compiled.SHARED`, or a `CompiledDecoder`; None: on a GPU
        for 32 tokens or more; False, the default: eager). Compiled, a model draft's steps are
        the compiled decode step and each verify pass one fixed-shape step of k + 1 tokens (on
        CUDA replayed CUDA graphs), warmed up before the clock starts (`warmup_seconds`); the
        result says what ran (`decode_path`), and where compiling fails the steps run eagerly
        and `decode_note` (and a warning) says why. A cache passed in then needs k - 1 more
        positions (each pass is padded to k + 1 tokens).
    The target's cache holds every token but the last ("pending") one; each pass feeds
    [pending, d_1..d_k] and gets the k + 1 distributions that check the drafts.
    """
    require_compatible_draft(target, draft)
    k = whole_number(k, "k (tokens drafted per step)", minimum=0)
    rows = token_rows(prompt, target.config.vocab_size)         # the checks every entry point shares
    if len(rows) != 1:
        raise LabError(f"Speculative decoding runs one prompt at a time (batch 1), got {len(rows)}.")
    prompt = rows[0]
    max_new_tokens = require_fits_context(target, len(prompt), max_new_tokens)
    device = target.device
    eos = set(target.config.eos_token_ids if eos_token_ids is None else token_id_set(eos_token_ids))
    generator = require_sampling(sampling).generator(device)        # the one seeding rule, as generate's
    max_len = len(prompt) + max_new_tokens
    decoder = choose_decoder(compile, device, max_new_tokens, cache)
    if cache is not None:
        require_fitting_cache(cache, 1, max_len, target)
    cache, target_pass, verify_path = _verify_pass(target, decoder, cache, k, max_len)   # compiled here, untimed
    draft_path = draft.warm_up(decoder, max_len)
    path = slowest(verify_path, draft_path) if draft_path is not None else verify_path
    stats, steps = SpeculativeStats(), [] if trace else None
    context = list(prompt)

    graphs_before = graphs_compiled()
    synchronize(device)
    t_start = time.perf_counter()
    draft.start(prompt, max_len, generator, sampling)           # a model draft reads the prompt here
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]], device=device), cache=cache)         # fill the cache: no logits
    synchronize(device)
    stats.prefill_seconds = time.perf_counter() - t_start

    new_tokens: list[int] = []
    while len(new_tokens) < max_new_tokens:
        # draft, verify, keep, roll back (_speculative_step): one target pass, 1 to k + 1 tokens
        k_step = min(k, max_new_tokens - len(new_tokens) - 1)    # never more than can still be used
        kept = _speculative_step(target_pass, draft, cache, context, k_step, sampling, generator, eos, stats,
                                 steps, device)
        context += kept
        new_tokens += kept
        if kept[-1] in eos:
            break
    synchronize(device)
    seconds = time.perf_counter() - t_start
    if decoder is not None and graphs_compiled() > graphs_before:     # never silent: said, and counted
        path = recompiled(path, graphs_compiled() - graphs_before)
    return SpeculativeResult(tokens=new_tokens, prompt_length=len(prompt), stats=stats, trace=steps,
                             seconds=seconds, path=path, verify_path=verify_path.path,
                             draft_path=draft_path.path if draft_path else None)


def _speculative_step(target_pass, draft: Draft, cache, context: list[int], k_step: int, sampling: SamplingConfig,
                      generator, eos: set[int], stats: SpeculativeStats, steps: list | None, device) -> list[int]:
    """One step of `speculative_generate`: the draft proposes, one target pass checks, the kept
    tokens come back and both caches roll back past the rest. Notebook 05 (speculative decoding)."""
    # 1. draft (never more than can still be used: each step adds up to k + 1 tokens)
    t0 = time.perf_counter()
    drafted, draft_probs = draft.propose(context, k_step) if k_step > 0 else ([], None)
    drafted = drafted[:k_step]
    synchronize(device)
    t1 = time.perf_counter()

    # 2. one target pass over [pending, d_1..d_k]: k + 1 next-token distributions
    start = cache.length
    logits = target_pass([context[-1], *drafted]).float()                         # (k + 1, vocab)
    target_probs = None if sampling.greedy else probabilities(logits, sampling)
    target_argmax = logits.argmax(dim=-1)                                         # (k + 1,)
    n, extra, kind = verify(target_probs, target_argmax, drafted,
                            draft_probs[: len(drafted)] if draft_probs is not None else None, generator)
    synchronize(device)
    t2 = time.perf_counter()

    # 3. keep d_1..d_n and the extra token, stopping at an end token
    kept = drafted[:n] + [extra]
    for j, token in enumerate(kept):
        if token in eos:
            kept = kept[: j + 1]
            break
    n_kept, extra_kept = stats.count(drafted, n, kept, kind, t1 - t0, t2 - t1)
    if steps is not None:
        steps.append(SpeculativeStep(drafted, n_kept, extra if extra_kept else None,
                                     kind if extra_kept else None, target_argmax.tolist()))

    # 4. roll back both caches past what was rejected: keep pending + d_1..d_n
    cache.truncate(start + 1 + n_kept)
    draft.accept(n_kept)
    return kept
