"""The whole decode layer in one C++ call (fused.decode_block, fused_ops.cpp; issue 40): it equals
the layer's Python code (the reference, fused kernels off) for float32 and W4A8 layers on odd
shapes, writes the cache exactly as the Python layer does, is taken on every layer of a plain CPU
decode step and nowhere else, and refuses bad arguments in one sentence. The same holds for the
serving engine's decode step over its paged pool (decode_block_paged): rows at different lengths,
their blocks interleaved in the pool."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.profiler import profile

from labsupport.engine.config import PRESETS
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import StaticKVCache
from labsupport.engine.kv_quant import Int8KVCache
from labsupport.engine.models import fused
from labsupport.engine.quant import quantize_model
from labsupport.engine.quant.w4a8 import w4a8_unavailable
from labsupport.engine.serving.block_manager import BlockManager
from labsupport.engine.serving.engine import Engine
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.engine.serving.paged_cache import PagedKVCache
from labsupport.engine.serving.request import Request, ServedSequence
from labsupport.weights.fixtures import random_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

# odd shapes: grouped heads (3 per kv head), one kv head, no grouping; head sizes 20 and 24
# (not multiples of the 8 running sums of its dot product), hidden sizes that are whole W4A8 blocks
SHAPES = {
    "gqa-3": dict(num_heads=6, num_kv_heads=2, hidden_size=96, intermediate_size=160),    # head_dim 16
    "mqa": dict(num_heads=4, num_kv_heads=1, hidden_size=96, intermediate_size=224),      # head_dim 24
    "mha": dict(num_heads=8, num_kv_heads=8, hidden_size=160, intermediate_size=192),     # head_dim 20
}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    reason = fused.load()
    if reason is not None:
        pytest.skip(f"the fused kernels are not available here: {reason}")


def model_of(shape: str, seed: int = 0):
    config = PRESETS["tiny-llama"].with_(num_layers=3, **SHAPES[shape])
    model = random_model(config, seed=seed)
    with torch.no_grad():                     # livelier weights than std 0.02: attention that varies
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(8)
    return model


def block_calls(run, op: str = "labsupport::decode_block") -> int:
    """How many times `run()` called the one-call layer (`op`: the static cache's, or the pool's)."""
    with profile() as trace:
        run()
    return sum(1 for event in trace.events() if event.name == op)


def decode_once(model, batch: int, context: int, fast: bool):
    """Prefill `context` tokens per row (the Python layers), then one decode step: (its logits,
    the cache, the one-call layers it ran)."""
    generator = torch.Generator().manual_seed(batch * 100 + context)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator)
    step = torch.randint(0, model.config.vocab_size, (batch, 1), generator=generator)
    cache = StaticKVCache.for_model(model, batch, context + 4)
    with torch.inference_mode():
        with fused.switched(False):
            model(prompt, cache=cache)
        with fused.switched(fast):
            out = {}
            calls = block_calls(lambda: out.setdefault("logits", model.logits(model(step, cache=cache), at=-1)))
    return out["logits"], cache, calls                                              # (batch, vocab), ...


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch, context", [(1, 1), (1, 37), (3, 9)])
def test_one_call_equals_the_layers_python_code_and_writes_the_same_cache(shape, batch, context):
    model = model_of(shape)
    fast, fast_cache, calls = decode_once(model, batch, context, fast=True)
    slow, slow_cache, none = decode_once(model, batch, context, fast=False)
    assert calls == model.config.num_layers and none == 0        # every layer of the step, once
    assert (fast - slow).abs().max() <= 1e-4 * slow.abs().max()    # attention summed in another order
    # the new token's keys and values: the same linear and rotation, so the same numbers
    written = slice(context, context + 1)
    torch.testing.assert_close(fast_cache.keys[:, :, :, written], slow_cache.keys[:, :, :, written],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_cache.values[:, :, :, written], slow_cache.values[:, :, :, written],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(w4a8_unavailable() is not None, reason=f"the W4A8 kernel: {w4a8_unavailable()}")
@pytest.mark.parametrize("shape", SHAPES)
def test_one_call_with_w4a8_layers_equals_their_python_code(shape):
    """Each linear through our W4A8 kernel from C++ (the dispatcher) as from Python. Activations are
    rounded to int8 per block on the way, so a last-bit difference before a linear (the attention's
    sums, in another order) may move one int8 step: the bound is a few such steps, far below int4's
    own error."""
    model = model_of(shape)
    quantize_model(model, "int4", group_size=32)
    assert all(layer.kernel == "w4a8" for layer in model.modules() if hasattr(layer, "w4a8_packed"))
    fast, _, calls = decode_once(model, 2, 21, fast=True)
    slow, _, _ = decode_once(model, 2, 21, fast=False)
    assert calls == model.config.num_layers
    assert (fast - slow).abs().max() <= 2e-2 * slow.abs().max()


def test_generate_gives_the_python_layers_tokens():
    model = model_of("gqa-3", seed=4)
    ids = list(range(3, 30))
    with fused.switched(False):
        reference = generate(model, ids, 24, eos_token_ids=())
    result = generate(model, ids, 24, eos_token_ids=())
    assert result.row(0) == reference.row(0)


def test_a_one_token_prefill_into_a_compiled_decoders_larger_cache_fills_its_own_rows():
    """3 one-token prompts in a bucket of 4 rows: the prefill is a one-token pass over fewer rows
    than the cache holds, which the call takes on the batch's rows of the buffers."""
    from torch._dynamo.testing import CompileCounter
    from labsupport.engine.compiled import CompiledDecoder
    model = model_of("mqa", seed=2)
    prompts = [[5], [9], [13]]
    with fused.switched(False):
        reference = generate(model, prompts, 6, eos_token_ids=())
    result = generate(model, prompts, 6, eos_token_ids=(), compile=CompiledDecoder(backend=CompileCounter()))
    assert result.tokens.tolist() == reference.tokens.tolist()


def test_taken_only_on_a_plain_float32_cpu_decode_step():
    """Where the block does not apply its Python code runs, which every other path keeps: padding
    (a mask), a window, an int8 cache, bf16, GPT-2, int8 weights, a forward hook on a part of the
    layer, gradients, switched off."""
    model = model_of("gqa-3")
    ids, padded = list(range(3, 20)), [list(range(3, 20)), list(range(5, 12))]
    assert block_calls(lambda: generate(model, ids, 3, eos_token_ids=())) == 2 * model.config.num_layers
    int8 = copy.deepcopy(model)
    quantize_model(int8, "int8")

    def switched_off():
        with fused.switched(False):
            generate(model, ids, 3, eos_token_ids=())
    never = {
        "a padded batch": lambda: generate(model, padded, 3, eos_token_ids=()),
        "a sliding window": lambda: generate(model.with_attention_window(4), ids, 3, eos_token_ids=()),
        "an int8 cache": lambda: generate(model, ids, 3, eos_token_ids=(), cache=Int8KVCache(model.config, 1, 24)),
        "bf16": lambda: generate(copy.deepcopy(model).to(torch.bfloat16), ids, 3, eos_token_ids=()),
        "GPT-2": lambda: generate(random_model("tiny-gpt2"), ids, 3, eos_token_ids=()),
        "int8 weights": lambda: generate(int8, ids, 3, eos_token_ids=()),
        "switched off": switched_off,
    }
    seen = []

    def hooked():
        handle = model.blocks[1].mlp.down.register_forward_hook(lambda module, inputs, out: seen.append(1))
        generate(model, ids, 3, eos_token_ids=())
        handle.remove()
    for name, run in never.items():
        assert block_calls(run) == 0, name
    # a hook on one layer's linear: that layer runs its Python code, the others the one call
    assert block_calls(hooked) == 2 * (model.config.num_layers - 1)
    assert len(seen) == 3                          # the hook saw the prefill and both decode steps
    cache = StaticKVCache.for_model(model, 1, 8)
    x = torch.tensor([[5]])
    assert block_calls(lambda: model(x, cache=cache)) == 0      # gradients on: the Python layers


def test_a_layers_arguments_are_gathered_again_after_any_change_to_it():
    """The arguments of each layer's call are gathered once and kept (fused._layer_args); a weight
    assigned anew, a linear swapped for a quantized one and back, a buffer replaced, or a norm's data
    cast in place must each be seen by the next step: its logits stay those of the Python layers."""
    model = model_of("gqa-3", seed=5)

    def agrees(layers_called: int, bound: float = 1e-4) -> None:
        fast, _, calls = decode_once(model, 2, 7, fast=True)
        slow, _, _ = decode_once(model, 2, 7, fast=False)
        assert calls == layers_called
        assert (fast - slow).abs().max() <= bound * slow.abs().max()

    agrees(model.config.num_layers)                                         # gathered, then kept
    down = model.blocks[1].mlp.down
    down.weight = torch.nn.Parameter(-2 * down.weight.detach())             # a weight assigned anew
    agrees(model.config.num_layers)
    if w4a8_unavailable() is None:
        handle = quantize_model(model, "int4", group_size=32)               # every linear swapped
        agrees(model.config.num_layers, bound=2e-2)
        quantized = model.blocks[0].attn.qkv
        quantized.w4a8_scales = 3 * quantized.w4a8_scales                   # a buffer replaced
        agrees(model.config.num_layers, bound=2e-2)
        handle.restore()                                                    # and back to float32
        agrees(model.config.num_layers)
    assert fused._layer_args(model.blocks[2]) is not None
    norm = model.blocks[2].mlp_norm.weight
    norm.data = norm.data.double()                    # cast in place: no registration, the same parameter
    assert fused._layer_args(model.blocks[2]) is None                       # never handed to C++ as float32
    for fast in (True, False):                        # the Python layer's own error, either way
        with pytest.raises(RuntimeError, match="dtype"):
            decode_once(model, 2, 7, fast=fast)


def test_refuses_bad_arguments_in_one_sentence():
    ops = torch.ops.labsupport
    w = [torch.randn(8, 8)]
    keys = torch.zeros(1, 1, 4, 4)
    cs = torch.randn(1, 1, 4)

    def call(x=torch.randn(1, 1, 8), k=keys, start=0):
        return ops.decode_block(x, torch.ones(8), torch.ones(8), [torch.randn(12, 8)], w, [torch.randn(16, 8)],
                                w, cs, cs, k, k.clone(), start, 1, 1e-5, "auto")
    for bad in (lambda: call(x=torch.randn(1, 2, 8)), lambda: call(x=torch.randn(1, 1, 8).double()),
                lambda: call(k=torch.zeros(2, 1, 4, 4)), lambda: call(start=4)):
        with pytest.raises(RuntimeError, match=r"^decode_block: .* must "):
            bad()


# --- the serving engine's decode step, over the paged pool (decode_block_paged) ----------------------

PAGED = "labsupport::decode_block_paged"


def paged_decode(model, lengths, fast: bool, block_size: int = 4, **runner_options):
    """Rows of `lengths` prompt tokens, their blocks handed out in turn so that each row's blocks lie
    apart in the pool; each prompt prefilled by the Python layers, then one decode step of every row
    through the serving runner: (its logits (rows, vocab), the pool, the one-call layers it ran)."""
    generator = torch.Generator().manual_seed(sum(lengths))
    blocks = BlockManager(num_blocks=64, block_size=block_size)
    cache = PagedKVCache(model.config, 64, block_size, dtype=model.dtype)
    runner = ModelRunner(model, cache, blocks, **runner_options)
    seqs = [ServedSequence(Request(torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist(),
                                   max_new_tokens=4), i, "cpu") for i, n in enumerate(lengths)]
    for upto in range(1, max(lengths) + 2):                  # a block for each row in turn: interleaved
        for seq, n in zip(seqs, lengths):
            blocks.grow(seq.index, min(upto, n + 1))
    with torch.inference_mode():
        with fused.switched(False):
            for seq in seqs:
                runner.forward([seq], [len(seq.tokens)])
                seq.num_cached = len(seq.tokens)             # the scheduler's postprocess, by hand
                seq.output.append(int(torch.randint(3, model.config.vocab_size, (1,), generator=generator)))
        with fused.switched(fast):
            out = {}
            calls = block_calls(lambda: out.setdefault("logits", runner.forward(seqs, [1] * len(seqs))), PAGED)
    return out["logits"], cache, calls


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lengths", [(1,), (7, 1, 12), (4, 8, 3, 16)])
def test_the_paged_step_equals_the_layers_python_code_and_writes_the_same_slots(shape, lengths):
    """Lengths that end a block (4, 8, 16: the new token opens the next one) and that do not."""
    model = model_of(shape)
    fast, fast_cache, calls = paged_decode(model, lengths, fast=True)
    slow, slow_cache, none = paged_decode(model, lengths, fast=False)
    assert calls == model.config.num_layers and none == 0
    assert (fast - slow).abs().max() <= 1e-4 * slow.abs().max()
    # every slot of the pool: the prompts' (the same Python prefill) and the new tokens' (one write each)
    torch.testing.assert_close(fast_cache.keys, slow_cache.keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_cache.values, slow_cache.values, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(w4a8_unavailable() is not None, reason=f"the W4A8 kernel: {w4a8_unavailable()}")
def test_the_paged_step_with_w4a8_layers_equals_their_python_code():
    model = model_of("gqa-3")
    quantize_model(model, "int4", group_size=32)
    fast, _, calls = paged_decode(model, (5, 13), fast=True)
    slow, _, _ = paged_decode(model, (5, 13), fast=False)
    assert calls == model.config.num_layers
    assert (fast - slow).abs().max() <= 2e-2 * slow.abs().max()      # as the static cache's W4A8 test


def test_the_serving_engine_serves_the_python_layers_tokens():
    """Three requests through two slots (so one joins a running batch): each gets the tokens the
    Python layers give it, and the step took the one call."""
    model = model_of("gqa-3", seed=4)
    requests = [Request(list(range(3, 3 + n)), max_new_tokens=10) for n in (5, 17, 9)]
    with fused.switched(False):
        reference = Engine(model, max_slots=2, block_size=4).run(requests, clock="steps")
    out = {}
    calls = block_calls(lambda: out.setdefault("run", Engine(model, max_slots=2, block_size=4).run(requests,
                                                                                                 clock="steps")), PAGED)
    assert [s.output for s in out["run"].sequences] == [s.output for s in reference.sequences]
    assert calls >= 9 * model.config.num_layers


def test_the_paged_step_is_taken_only_where_each_rows_length_is_its_whole_mask():
    """A sliding window (the mask hides more than the length) and attention over the pool in place
    keep the Python layers; so do float64 weights."""
    model = model_of("mqa")
    assert paged_decode(model, (6, 3), fast=True)[2] == model.config.num_layers
    assert paged_decode(model.with_attention_window(4), (6, 3), fast=True)[2] == 0
    assert paged_decode(model, (6, 3), fast=True, attention="pool")[2] == 0
    assert paged_decode(copy.deepcopy(model).double(), (6, 3), fast=True)[2] == 0


def test_the_paged_call_refuses_bad_arguments_in_one_sentence():
    ops = torch.ops.labsupport
    w = [torch.randn(8, 8)]
    pool = torch.zeros(8, 1, 4)                            # 2 blocks of 4 slots, one kv head, D 4
    cs = torch.randn(1, 1, 4)

    def call(slots=torch.tensor([1]), tables=torch.tensor([[0]]), lengths=torch.tensor([2]), k=pool):
        return ops.decode_block_paged(torch.randn(1, 1, 8), torch.ones(8), torch.ones(8), [torch.randn(12, 8)],
                                      [torch.randn(8, 4)], [torch.randn(16, 8)], w, cs, cs, k, k.clone(), slots,
                                      tables, lengths, 4, 1, 1e-5, "auto")
    assert call().shape == (1, 1, 8)
    for bad in (lambda: call(tables=torch.tensor([[2]])),              # a block past the pool
                lambda: call(lengths=torch.tensor([5])),               # longer than its table
                lambda: call(lengths=torch.tensor([0])),
                lambda: call(slots=torch.tensor([8])),                 # a write past the pool
                lambda: call(tables=torch.tensor([[0]], dtype=torch.int32)),
                lambda: call(k=torch.zeros(8, 1, 4).double())):
        with pytest.raises(RuntimeError, match=r"^decode_block_paged: .* must |^decode_block_paged: a "):
            bad()
