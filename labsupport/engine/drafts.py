"""Drafts for speculative decoding: who proposes the tokens the target checks.

Introduced in notebook 05 (speculative decoding); the loop that uses them is in
speculative.py, which also exports every name here.

All drafts sit behind one small interface, `Draft`:

* `ModelDraft`: any causal LM with the target's tokenizer, with its own KV cache
  (any `KVCache`, made by its `cache_factory`; a `StaticKVCache` by default);
* `QuantizedSelfDraft`: the target's own int4 (or int8) copy (notebook 04);
* `PromptLookupDraft`: no model at all; copy what followed the last n tokens
  earlier in the context (prompt-lookup decoding, Saxena 2023). It pays when the
  answer quotes the prompt (summaries, edits, code changes), not in free text.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch

from ..errors import LabError
from .compiled import DecodePath
from .kv_cache import KVCache, StaticKVCache, require_fitting_cache
from .sampling import GREEDY, SamplingConfig, probabilities, require_sampling

CacheFactory = Callable[..., KVCache]       # (model, batch_size, max_len) -> an empty KVCache


class Draft:
    """What speculative decoding needs from a draft. Introduced in notebook 05.

    `warm_up` is called once per generation, before anything is timed, with the compiled
    decoder (or None: eager), `start` then, with the sampling the target uses (a model
    draft samples the same way, and reads the prompt there, timed with the target's
    prefill), `propose` once per step, and `accept` after the target has checked the
    proposal, with how many drafted tokens it kept, so that a draft with state (a KV
    cache) can roll back the rest.
    """

    vocab_size: int | None = None       # None: the draft works on any vocabulary
    name = "draft"

    def warm_up(self, decoder, max_len: int) -> DecodePath | None:
        """Get this generation's steps ready to run on `decoder` (a `CompiledDecoder`; None: eager
        steps) for at most `max_len` tokens in all, compiled before anything is timed; returns what
        the steps run on, or None for a draft without a model (nothing to compile)."""
        return None

    def start(self, prompt: Sequence[int], max_len: int, generator: torch.Generator | None,
              sampling: SamplingConfig = GREEDY) -> None:
        """Get ready for a new generation of at most `max_len` tokens in all, sampled with
        `sampling` (the target's) from `generator`."""

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], torch.Tensor | None]:
        """Up to k tokens that might follow `context`, and their draft distributions
        (len(tokens), vocab), or None when the draft is deterministic (a point mass)."""
        raise NotImplementedError

    def accept(self, n_accepted: int) -> None:
        """The target kept the first `n_accepted` tokens of the last proposal."""


class ModelDraft(Draft):
    """A smaller causal LM sharing the target's tokenizer, with its own KV cache. Notebook 05.

    It samples with the target's `SamplingConfig` (temperature, top-k, top-p), which
    `start` receives for each generation, so its distributions are comparable; greedy,
    it returns no probabilities. Its cache always holds a prefix of the context: the
    tokens it has drafted beyond what the target kept are cut off by `truncate`.

    cache_factory: (model, batch_size, max_len) -> an empty `KVCache`, called once per
    generation (checked); default `StaticKVCache.for_model`. A compiled generation
    (`warm_up` with a decoder) drafts with the decoder's one-token step on the decoder's own
    cache instead, one token at a time, as `generate` decodes.
    """

    def __init__(self, model, *, name: str | None = None, cache_factory: CacheFactory | None = None):
        if cache_factory is not None and not callable(cache_factory):
            raise LabError(f"cache_factory must be a function (model, batch_size, max_len) -> KV cache, "
                           f"got {type(cache_factory).__name__!r}.")
        self.model, self.sampling = model, GREEDY            # the sampling is the target's: set by `start`
        self.vocab_size = model.config.vocab_size
        self.name = name or f"model draft ({model.config.name})"
        self.cache_factory = cache_factory or StaticKVCache.for_model
        self.cache: KVCache | None = None
        self.generator = None
        self._base = 0                      # context length when the last proposal started
        self._compiled = None               # (decoder, its cache, key mask) while warmed up; None: eager

    def warm_up(self, decoder, max_len):
        self._compiled = None
        if decoder is None:
            return None
        if self.cache_factory != StaticKVCache.for_model:
            raise LabError("A compiled model draft drafts on the compiled decoder's own cache, and this draft "
                           "has a cache_factory of its own; pass compile=False, or a draft without one.")
        cache = decoder.cache_for(self.model, 1, max_len, purpose="draft")
        path = decoder.warm_up(self.model, cache)
        key_mask = torch.ones(1, cache.max_len, dtype=torch.bool, device=cache.device)   # (1, max_len): no padding
        self._compiled = (decoder if path.compiled else None, cache, key_mask)
        return path

    @torch.inference_mode()
    def start(self, prompt, max_len, generator, sampling=GREEDY):
        require_sampling(sampling)
        if self._compiled is not None:
            cache = self._compiled[1]
            cache.truncate(0)
        else:
            cache = self.cache_factory(self.model, 1, max_len)
        require_fitting_cache(cache, 1, max_len, self.model)
        self.cache, self.generator, self.sampling = cache, generator, sampling
        # read the prompt now (like the target's prefill), so that each step's drafting
        # time is the drafting alone: the first proposal then feeds one token, as all others
        if len(prompt) > 1:
            self.model(torch.tensor([list(prompt[:-1])], device=self.model.device), cache=cache)   # no logits

    def _next(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token from the last logits (vocab,), left on the device as a (1,) tensor (no wait for
        the GPU: the next step is fed it there), and its distribution (None if greedy)."""
        if self.sampling.greedy:
            return logits.argmax().view(1), None                                # (1,)
        probs = probabilities(logits, self.sampling)                        # (vocab,)
        return torch.multinomial(probs, 1, generator=self.generator), probs   # (1,)

    @torch.inference_mode()
    def propose(self, context, k):
        if self.cache is None:
            raise LabError("Call draft.start(...) before propose (speculative_generate does this).")
        self._base = len(context)
        tokens, probs = [], []
        # the cache holds context[:length]: feed the rest
        new = torch.tensor(list(context[self.cache.length:]), dtype=torch.long, device=self.model.device)   # (T,)
        for _ in range(k):
            token, p = self._next(self._feed(new))                             # token: (1,), on the device
            tokens.append(token)
            probs.append(p)
            new = token
        # d_k itself is never fed: the cache now holds context + d_1..d_{k-1}
        draft_probs = None if self.sampling.greedy or not tokens else torch.stack(probs)  # (k, vocab)
        return (torch.cat(tokens).tolist() if tokens else []), draft_probs     # one transfer per step

    def _feed(self, new: torch.Tensor) -> torch.Tensor:
        """Feed the `new` tokens (T,), on the device, to the draft's cache; the logits after the last
        one (vocab,): one eager pass, or on the compiled path one compiled decode step per token (its
        position the cache's length, filled in on the device)."""
        decoder = self._compiled[0] if self._compiled is not None else None
        if decoder is None:
            return self.model.logits(self.model(new[None], cache=self.cache), at=-1)[0]    # (vocab,)
        for i in range(new.shape[0]):
            logits = decoder.step(self.model, self.cache, new[i:i + 1], None, self._compiled[2])   # (1, vocab)
        return logits[0]                                                                  # (vocab,)

    def accept(self, n_accepted):
        # keep context + the accepted drafts; the token the target adds is fed next time
        self.cache.truncate(min(self.cache.length, self._base + n_accepted))


class QuantizedSelfDraft(ModelDraft):
    """The target's own weights quantized (int4 groups of 32 by default) as its draft.

    Same vocabulary and nearly the same predictions (high acceptance), fewer bytes
    per step (notebook 04). The target itself is untouched: a copy is quantized. Notebook 05.
    """

    def __init__(self, target, method: str = "int4", group_size: int = 32,
                 cache_factory: CacheFactory | None = None):
        draft_model, self.handle = quantized_copy(target, method, group_size)
        super().__init__(draft_model, name=f"{method} self-draft", cache_factory=cache_factory)


def quantized_copy(model, method: str = "int4", group_size: int = 32):
    """A deep copy of `model` with its linear layers quantized, and the quantization handle
    (notebook 05's self-draft).

    labsupport.engine.quant (notebook 04) is imported only here, so speculative decoding
    works without it; if it cannot be imported the error says so in one sentence."""
    try:
        from .quant import quantize_model
    except ImportError as error:
        raise LabError(f"The quantized self-draft needs labsupport.engine.quant (notebook 04), which "
                       f"cannot be imported here ({error}); use another draft.") from None
    draft = copy.deepcopy(model)
    handle = quantize_model(draft, method, group_size=group_size)
    return draft, handle


class PromptLookupDraft(Draft):
    """Prompt-lookup decoding: find the last `ngram` tokens earlier in the context and
    propose the tokens that followed them (falling back to shorter n-grams, down to
    `min_ngram`). No model, no cost worth counting; a point-mass proposal, so for
    sampling the draft distribution is one-hot and d is accepted with probability p(d).

    k: a cap on the tokens proposed per step (None: as many as the caller asks for).
    Notebook 05 (speculative decoding).
    """

    name = "prompt lookup"

    def __init__(self, ngram: int = 3, k: int | None = None, min_ngram: int = 1):
        if not 1 <= min_ngram <= ngram:
            raise LabError(f"Need 1 <= min_ngram <= ngram, got min_ngram={min_ngram}, ngram={ngram}.")
        self.ngram, self.max_tokens, self.min_ngram = ngram, k, min_ngram

    def propose(self, context, k):
        k = k if self.max_tokens is None else min(k, self.max_tokens)
        ids = torch.as_tensor(list(context), dtype=torch.long)
        for n in range(self.ngram, self.min_ngram - 1, -1):
            if len(ids) <= n or k == 0:
                continue
            tail = ids[-n:]
            windows = ids[:-1].unfold(0, n, 1)                # (len - n, n): every earlier n-gram
            starts = (windows == tail).all(dim=1).nonzero().flatten()
            if len(starts):
                after = int(starts[-1]) + n                   # the most recent earlier match
                return ids[after: after + k].tolist(), None
        return [], None
