"""What the serving tests hold a served request against, in one home: the tokens `generate` gives
the same request alone (the serving invariant), the policies the tests plug in, and the patches
that watch an engine (the tokens each forward pass computes; writes to shared blocks).

Used by tests/test_serving_alone.py (the invariant, over every setting) and by the other serving
and server tests. Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

import torch

from labsupport.engine.generation import generate
from labsupport.engine.sampling import GREEDY
from labsupport.engine.serving import Decision, Policy
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.engine.serving.paged_cache import PagedView
from labsupport.weights.fixtures import ByteTokenizer


def alone(model, request) -> list[int]:
    """The tokens `request` (a serving `Request`) gets from `generate` with nothing beside it."""
    return generate(model, request.prompt, request.max_new_tokens, sampling=request.sampling,
                    eos_token_ids=request.eos_token_ids).row(0)


def alone_text(model, prompt: str, max_tokens: int, sampling=GREEDY, eos=()) -> list[int]:
    """The tokens a served text prompt gets alone: the fixtures' byte tokenizer, then `generate`."""
    return generate(model, ByteTokenizer().encode(prompt), max_tokens, sampling=sampling, eos_token_ids=eos).row(0)


def prompts(n=6, seed=0, vocab=256, lengths=(5, 9, 3, 12, 7, 4, 10, 6)) -> list[list[int]]:
    """`n` seeded random prompts of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths[:n]]


def chat_like(n=8, system=13, seed=0, vocab=256) -> list[list[int]]:
    """Prompts that all start with the same `system` tokens (a system prompt), then differ."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(0, vocab, (system,), generator=g).tolist()
    return [head + torch.randint(0, vocab, (k,), generator=g).tolist() for k in (5, 9, 3, 12, 7, 4, 10, 6)[:n]]


class DrainThenRefill(Policy):
    """Admit only into an empty server; finished sequences give their slot back at once."""

    name = "drain-then-refill"

    def decide(self, view):
        return Decision(vacate=view.finished, admit=() if view.running else view.waiting)


class ShortestPromptFirst(Policy):
    """Continuous batching that admits the shortest waiting prompt first."""

    name = "shortest-prompt-first"

    def decide(self, view):
        return Decision(vacate=view.finished, admit=tuple(sorted(view.waiting, key=lambda s: len(s.tokens))))


def counting_forward(monkeypatch) -> list[int]:
    """Patch ModelRunner.forward to record the tokens each pass computes (rows' chunks + padding rows)."""
    computed, original = [], ModelRunner.forward

    def forward(self, seqs, chunks, padding_rows=0):
        computed.append(sum(chunks) + padding_rows)
        return original(self, seqs, chunks, padding_rows)

    monkeypatch.setattr(ModelRunner, "forward", forward)
    return computed


def step_tokens(step) -> int:
    """The tokens one recorded step computed: decode rows, prefill tokens and padding rows."""
    return step.decode_rows + step.prefill_tokens + step.padding_rows


def watch_shared_writes(monkeypatch) -> list:
    """Make every paged write fail if it touches a block the prefix cache holds; returns the
    list of engines to watch (append each engine to it)."""
    engines, original = [], PagedView.write

    def write(self, layer, k, v):
        for engine in engines:
            if engine.cache is self.cache:
                frozen = engine.blocks.read_only_blocks()
                touched = set((self.write_slots // self.cache.block_size).tolist())
                assert not touched & frozen, f"a shared block was written: {touched & frozen}"
        return original(self, layer, k, v)

    monkeypatch.setattr(PagedView, "write", write)
    return engines
