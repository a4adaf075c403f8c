"""The Hugging Face peers: transformers doing the same work as labsupport, to time beside it.

Introduced in notebook 00 (where the time goes), where `generate()` is the first peer;
notebooks 02 (a padded batch), 05 (prompt-lookup decoding) and 07 (the stack's last
rung) add theirs. The serving peers (notebook 06) are in serving_peers.py.

Every peer runs greedy for exactly the requested number of new tokens (end-of-sequence
disabled), so that its tokens can be compared with ours and a ratio of times is a
ratio of equal work.
"""

from __future__ import annotations

import copy
import time

import torch

from ..hardware import synchronize
from ..serving.request import Request
from ..stack import HF_PEER, Stage


def hf_greedy_config(hf_model, new_tokens: int):
    """Hugging Face generation settings: greedy, exactly `new_tokens` tokens (end-of-sequence disabled).

    Introduced in notebook 00 (where the time goes)."""
    config = copy.deepcopy(hf_model.generation_config)
    # An empty list, not None: transformers 5 reads None as "unset" and puts the model's
    # end token back, so generate() stopped at <|im_end|> short of `new_tokens`.
    config.eos_token_id = []
    config.max_new_tokens = new_tokens
    config.do_sample = False
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    return config


def hf_generate_fn(hf_model, prompt_ids: list[int], new_tokens: int, prompt_lookup: int | None = None,
                   lookup_ngram: int = 3):
    """Hugging Face greedy generate() for exactly `new_tokens` tokens, batch 1: a zero-argument
    function returning the output ids, prompt included, shape (1, prompt + new tokens).

    Introduced in notebook 00 (where the time goes). prompt_lookup: draft that many tokens
    by prompt-lookup decoding (transformers' ``prompt_lookup_num_tokens``; notebook 05),
    matching n-grams of up to `lookup_ngram` tokens (``max_matching_ngram_size``, 2 by
    default in transformers; 3 here, as `PromptLookupDraft`'s default).
    """
    config = hf_greedy_config(hf_model, new_tokens)
    if prompt_lookup is not None:
        config.prompt_lookup_num_tokens = prompt_lookup
        config.max_matching_ngram_size = lookup_ngram
    inputs = torch.tensor([prompt_ids], device=hf_model.device)

    @torch.inference_mode()
    def run():
        return hf_model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config)
    return run


class ForwardPasses:
    """Every forward pass of a Hugging Face model while it is active: how many tokens each
    one fed and how long it took (the device synchronized around each, so time a run with
    it apart from the timed runs). ``with ForwardPasses(hf) as passes: run()``.

    Introduced in notebook 05 (speculative decoding): how many target passes Hugging
    Face's prompt-lookup decoding made, and what one cost."""

    def __init__(self, hf_model):
        self.model, self.tokens, self.seconds, self._handles = hf_model, [], [], []

    def _before(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens.append(int(ids.shape[1]) if ids is not None else 0)
        synchronize(self.model.device)
        self._start = time.perf_counter()

    def _after(self, module, args, kwargs, output):
        synchronize(self.model.device)
        self.seconds.append(time.perf_counter() - self._start)

    def __enter__(self):
        self._handles = [self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                         self.model.register_forward_hook(self._after, with_kwargs=True)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return False


def hf_padded_generate_fn(hf_model, padded, new_tokens: int):
    """Hugging Face greedy generate() on a left-padded batch (`batching.left_pad`): a zero-argument
    function returning the new tokens only, shape (batch, new_tokens).

    Introduced in notebook 02 (batching)."""
    config = hf_greedy_config(hf_model, new_tokens)

    @torch.inference_mode()
    def run():
        return hf_model.generate(padded.tokens, attention_mask=padded.attention_mask.long(),
                                 generation_config=config)[:, padded.tokens.shape[1]:]
    return run


def hf_stack_stage(hf_model, requests: list[Request]) -> Stage:
    """The stack's peer (`stack.run_stack(..., peers=[...])`): Hugging Face generate(), fp32,
    one request at a time, each for its own number of new tokens.

    Introduced in notebook 07 (putting it together)."""
    runs = [(r, hf_generate_fn(hf_model, r.prompt, r.max_new_tokens)) for r in requests]
    return Stage(HF_PEER, "transformers generate(), fp32, one request at a time",
                 lambda: {r.request_id: run()[0, len(r.prompt):].tolist() for r, run in runs})
