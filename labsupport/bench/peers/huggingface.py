"""The Hugging Face peers: transformers doing the same work as labsupport, to time beside it.

Introduced in notebook 00 (where the time goes), where `generate()` is the first peer,
beside Hugging Face's own fast path (static cache + torch.compile) and its assisted
generation (the llama.cpp peer is in llamacpp.py);
notebooks 02 (a padded batch), 05 (prompt-lookup decoding) and 07 (the stack's last
rung) add theirs. The serving peers (notebook 06) are in continuous_batching.py.

Every peer runs greedy for exactly the requested number of new tokens (end-of-sequence
disabled), so that its tokens can be compared with ours and a ratio of times is a
ratio of equal work.
"""

from __future__ import annotations

import copy
import time

import torch

from ...errors import LabError
from ...engine.hardware import synchronize
from ...engine.serving.request import Request
from ...lab.measure import timed_compile
from ...lab.stack import HF_PEER, Stage
from ..core import GraphCount


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
    return _batch_one_run(hf_model, prompt_ids, config)


def _batch_one_run(hf_model, prompt_ids: list[int], config, **generate_kwargs):
    """generate() of one prompt with `config` (and e.g. an assistant_model), as a zero-argument function."""
    inputs = torch.tensor([prompt_ids], device=hf_model.device)          # (1, prompt)

    @torch.inference_mode()
    def run():
        return hf_model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config,
                                 **generate_kwargs)
    return run


def hf_static_compiled_fn(hf_model, prompt_ids: list[int], new_tokens: int):
    """Hugging Face's documented fast path: generate() with its static cache and the model's
    forward compiled by torch.compile (transformers' `CompileConfig` defaults: inductor,
    mode "reduce-overhead"). A zero-argument function like `hf_generate_fn`'s.

    Introduced in notebook 00 (where the time goes). transformers compiles by itself only
    on GPUs; `_compile_all_devices` (its switch for other devices) makes it compile on a
    CPU too. The first call compiles: time it apart (the bench reports it as compile time).
    """
    return _batch_one_run(hf_model, prompt_ids, hf_static_compiled_config(hf_model, new_tokens))


def hf_static_compiled_config(hf_model, new_tokens: int):
    """`hf_greedy_config` with the static cache and torch.compile (`CompileConfig()`'s defaults:
    mode "reduce-overhead", which records CUDA graphs on a GPU), compiling on any device. On a GPU
    this is how every Hugging Face row is timed, labelled by torch's counts (`core.GraphCount`). Notebook 00."""
    from transformers.generation.configuration_utils import CompileConfig

    config = hf_greedy_config(hf_model, new_tokens)
    config.cache_implementation = "static"
    compile_config = CompileConfig()
    compile_config._compile_all_devices = True
    config.compile_config = compile_config
    return config


def hf_early_layers_draft(hf_model, num_layers: int):
    """A draft for Hugging Face's assisted generation: a copy of the model that keeps only
    its first `num_layers` decoder layers (the same embedding, final norm and output layer),
    so it shares the target's tokenizer and needs no second checkpoint.

    Introduced in notebook 00 (where the time goes), as a peer; notebook 05 (speculative
    decoding) explains why any cheap draft keeps greedy output exact.
    """
    layers = hf_model.model.layers
    if not 1 <= num_layers < len(layers):
        raise LabError(f"An early-layers draft keeps 1 to {len(layers) - 1} of the model's "
                       f"{len(layers)} layers, got {num_layers}.")
    draft = copy.deepcopy(hf_model)
    draft.model.layers = draft.model.layers[:num_layers]
    draft.config.num_hidden_layers = num_layers
    return draft


def hf_assisted_fn(hf_model, draft_model, prompt_ids: list[int], new_tokens: int):
    """Hugging Face's assisted generation (``assistant_model``), greedy: the draft proposes
    tokens and the target checks them in one pass. A zero-argument function like
    `hf_generate_fn`'s. Introduced in notebook 00 (where the time goes), as a peer."""
    return _batch_one_run(hf_model, prompt_ids, hf_greedy_config(hf_model, new_tokens), assistant_model=draft_model)


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


def hf_padded_generate_fn(hf_model, padded, new_tokens: int, graphed: bool = False):
    """Hugging Face greedy generate() on a left-padded batch (`padding.left_pad`): a zero-argument
    function returning the new tokens only, shape (batch, new_tokens). graphed: its static cache
    + torch.compile (`hf_static_compiled_config`), as timed on a GPU (`measure.timed_compile`).

    Introduced in notebook 02 (batching)."""
    config = (hf_static_compiled_config if graphed else hf_greedy_config)(hf_model, new_tokens)

    @torch.inference_mode()
    def run():
        return hf_model.generate(padded.tokens, attention_mask=padded.attention_mask.long(),
                                 generation_config=config)[:, padded.tokens.shape[1]:]
    return run


def hf_stack_stage(hf_model, requests: list[Request]) -> Stage:
    """The stack's peer (`stack.run_stack(..., peers=[...])`): Hugging Face generate(), fp32,
    one request at a time, each for its own number of new tokens.

    Introduced in notebook 07 (putting it together). On a GPU it is timed graphed, as every
    contender there: its static cache + torch.compile (`measure.timed_compile`), its decode path
    what torch counted around each request's first (compiling) run (`core.GraphCount`)."""
    graphed = timed_compile(hf_model.device)
    make = hf_static_compiled_fn if graphed else hf_generate_fn
    count = GraphCount()
    runs = [(r, count.first_call(make(hf_model, r.prompt, r.max_new_tokens))) for r in requests]
    paths = set()

    def run():
        tokens = {r.request_id: run_one()[0, len(r.prompt):].tolist() for r, run_one in runs}
        paths.clear()                     # the Stage's own set: it says the path after the runs
        paths.add(count.hf_path(graphed))
        return tokens
    return Stage(HF_PEER, "transformers generate(), fp32, one request at a time"
                 + (", static cache + torch.compile" if graphed else ""), run, decode_paths=paths)
