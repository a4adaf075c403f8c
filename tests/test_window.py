"""The sliding window reaches every path that attends (issue 26, item 1): each path's tokens
equal a reference built here from scratch, with an explicit mask (query i sees keys i - W < j <= i),
through the one entrance of a model that has no window at all."""

import pytest
import torch

from labsupport.engine.compiled import CompiledDecoder
from labsupport.engine.drafts import ModelDraft, PromptLookupDraft
from labsupport.engine.generation import decode_step, generate, generate_naive, prefill
from labsupport.engine.kv_cache import StaticKVCache
from labsupport.engine.serving import Engine, Request
from labsupport.engine.speculative import speculative_generate
from labsupport.weights.fixtures import lively_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

WINDOW, NEW = 5, 10
PROMPTS = [[(11 * i + 5) % 250 for i in range(12)], [(7 * i + 1) % 250 for i in range(8)],
           [(13 * i + 2) % 250 for i in range(3)]]


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def plain(request):
    """A lively model (its tokens depend on the context) in float64, without a window."""
    return lively_model(request.param, seed=2).to(torch.float64)


@pytest.fixture(scope="module")
def windowed(plain):
    return plain.with_attention_window(WINDOW)


def window_mask(T: int) -> torch.Tensor:
    """The rule itself, (1, 1, T, T): key j is seen by query i when i - WINDOW < j <= i."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return ((j <= i) & (j > i - WINDOW))[None, None]


@torch.inference_mode()
def reference(plain, prompt, new_tokens=NEW) -> list[int]:
    """Greedy tokens of the window, without a cache: the whole sequence and the explicit mask."""
    sequence = list(prompt)
    for _ in range(new_tokens):
        hidden = plain(torch.tensor([sequence]), mask=window_mask(len(sequence)))
        sequence.append(int(plain.logits(hidden, at=-1).argmax()))
    return sequence[len(prompt):]


def test_the_window_changes_these_tokens(plain, windowed):
    """Else every check below would pass with full attention too."""
    assert reference(plain, PROMPTS[0]) != generate(plain, PROMPTS[0], NEW, eos_token_ids=()).row(0)
    assert windowed.config.attention_window == WINDOW and plain.config.attention_window is None
    assert windowed.embed is plain.embed and windowed.blocks is plain.blocks    # the same weights


def test_generate_and_the_naive_loop_use_the_window(plain, windowed):
    for prompt in PROMPTS:
        want = reference(plain, prompt)
        assert generate(windowed, prompt, NEW, eos_token_ids=()).row(0) == want
        assert generate_naive(windowed, prompt, NEW, eos_token_ids=()).row(0) == want


def test_a_padded_batch_uses_the_window_in_every_row(plain, windowed):
    batch = generate(windowed, PROMPTS, NEW, eos_token_ids=())
    assert [batch.row(i) for i in range(len(PROMPTS))] == [reference(plain, p) for p in PROMPTS]


def test_prefill_and_decode_steps_use_the_window(plain, windowed):
    prompt = PROMPTS[0]
    cache = StaticKVCache.for_model(windowed, 1, len(prompt) + NEW)
    logits, tokens = prefill(windowed, torch.tensor([prompt]), cache), []
    for _ in range(NEW):
        tokens.append(int(logits.argmax()))
        logits = decode_step(windowed, cache, torch.tensor([tokens[-1]]))
    assert tokens == reference(plain, prompt)


def test_the_compiled_step_uses_the_window(plain, windowed):
    from torch._dynamo.testing import CompileCounter
    decoder = CompiledDecoder(backend=CompileCounter())            # the traced graph, run as traced
    for prompt in (PROMPTS[0], PROMPTS):
        result = generate(windowed, prompt, NEW, eos_token_ids=(), compile=decoder)
        assert result.decode_path == "compiled"
        rows = [prompt] if isinstance(prompt[0], int) else prompt
        assert [result.row(i) for i in range(len(rows))] == [reference(plain, p) for p in rows]


def test_speculative_decoding_uses_the_window(plain, windowed):
    want = reference(plain, PROMPTS[0])
    for draft in (PromptLookupDraft(ngram=2), ModelDraft(windowed)):
        assert speculative_generate(windowed, draft, PROMPTS[0], NEW, k=3, eos_token_ids=()).tokens == want


@pytest.mark.parametrize("token_budget", [None, 6])                # whole prompts; chunked prefill
@pytest.mark.parametrize("attention", ["gather", "pool"])
def test_the_serving_engine_uses_the_window(plain, windowed, token_budget, attention):
    engine = Engine(windowed, max_slots=2, block_size=4, token_budget=token_budget)
    engine.runner.attention = attention
    requests = [Request(p, max_new_tokens=NEW, request_id=i) for i, p in enumerate(PROMPTS)]
    result = engine.run(requests, clock="steps")
    assert [seq.output for seq in result.sequences] == [reference(plain, p) for p in PROMPTS]
