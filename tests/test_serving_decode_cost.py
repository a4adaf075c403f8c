"""The decode path's own cost (notebook 06): block tables kept as a tensor updated in place,
the gather by whole blocks, attention over the pool in place (checked against the gather:
equal logits), and `decode_step_costs`' report. No timed assertions: only its shape."""

import pytest
import torch

from labsupport.lab.busy import busy_reason
from labsupport.errors import LabError
from labsupport.lab.measure import Timing
from labsupport.engine.serving import BlockManager, Engine, PagedKVCache, Request, ServedSequence
from labsupport.lab.serving_workload import make_workload
from labsupport.lab.serving_decode_cost import decode_step_costs, gather_by_slots
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.lab.serving_decode_cost import list_tables
from serving_reference import prompts


def test_the_table_tensor_follows_the_lists_in_place():
    blocks = BlockManager(num_blocks=50, block_size=2)
    before = blocks.table_tensor.data_ptr()
    for grown in (1, 5, 9):
        for seq in range(3):
            blocks.grow(seq, grown + seq)
    blocks.release(1)
    blocks.grow(3, 4)                                         # takes the row seq 1 gave back
    live = [0, 2, 3]
    expected = list_tables([blocks.table(i) for i in live] + [[]], 50, 50, "cpu")
    assert torch.equal(blocks.table_rows(live, padding_rows=1), expected)
    assert blocks.table_tensor.data_ptr() == before           # updated in place, never rebuilt
    for seq in range(20):                                     # more sequences than rows: the rows double
        blocks.grow(100 + seq, 1)
    assert torch.equal(blocks.table_rows([0, 119])[:, :5], list_tables([blocks.table(0), blocks.table(119)], 50, 5, "cpu"))


def _ragged_state(model, blocks, runner):
    """Three sequences at different lengths, their blocks interleaved, with one decoding."""
    seqs = [ServedSequence(Request(p, max_new_tokens=8), i, "cpu") for i, p in enumerate(prompts(3))]
    for grown in (2, 30):
        for seq in seqs:
            blocks.grow(seq.index, grown)
    runner.forward([seqs[0]], [5])
    seqs[0].num_cached = 5                       # the scheduler's postprocess, by hand
    seqs[0].output.append(7)
    runner.forward([seqs[1]], [4])
    seqs[1].num_cached = 4
    return seqs


@pytest.mark.parametrize("padding_rows", [0, 2])
def test_attention_over_the_pool_gives_the_gathers_logits(tiny_model_f64, padding_rows):
    model = tiny_model_f64
    results = {}
    for attention in ("gather", "pool"):
        blocks = BlockManager(num_blocks=40, block_size=4)
        cache = PagedKVCache(model.config, 40, 4, dtype=model.dtype)
        runner = ModelRunner(model, cache, blocks, attention=attention)
        seqs = _ragged_state(model, blocks, runner)
        results[attention] = runner.forward(seqs, [1, 3, 2], padding_rows)
        for seq, n in zip(seqs, (1, 3, 2)):
            seq.num_cached += n
        seqs[0].output.append(9), seqs[1].output.append(9)
        results[attention + " decode"] = runner.forward(seqs[:2], [1, 1], padding_rows)
    torch.testing.assert_close(results["pool"], results["gather"], rtol=0, atol=1e-10)
    torch.testing.assert_close(results["pool decode"], results["gather decode"], rtol=0, atol=1e-10)


def test_an_engine_serving_over_the_pool_gives_the_same_tokens(tiny_model_f64):
    requests = make_workload(prompts(), count=8, rate=0.7, median_new_tokens=8, max_new_tokens=16, seed=3)
    runs = []
    for attention in ("gather", "pool"):
        engine = Engine(tiny_model_f64, max_slots=3, block_size=4, cache_tokens=48, token_budget=5,
                        prefix_caching=True)
        engine.runner.attention = attention
        runs.append(engine.run(requests, clock="steps").tokens())
        engine.blocks.assert_no_leaks()
    assert runs[0] == runs[1]


def test_the_gather_by_slots_equals_the_gather_by_blocks(tiny_model_f64):
    blocks = BlockManager(num_blocks=40, block_size=4)
    cache = PagedKVCache(tiny_model_f64.config, 40, 4, dtype=tiny_model_f64.dtype)
    runner = ModelRunner(tiny_model_f64, cache, blocks)
    seqs = _ragged_state(tiny_model_f64, blocks, runner)
    tables = blocks.table_rows([s.index for s in seqs], width=3)
    view = cache.view(tables, torch.zeros(3, 1, dtype=torch.long), torch.tensor([5, 4, 1]))
    by_slots = gather_by_slots(cache, tables, 5)
    for layer in range(tiny_model_f64.config.num_layers):
        keys, values = view.gather(layer)                                    # (B, kv_heads, S, D)
        assert torch.equal(keys.transpose(1, 2), by_slots[layer][0])
        assert torch.equal(values.transpose(1, 2), by_slots[layer][1])


def test_decode_step_costs_reports_shares_that_add_up(tiny_llama):
    costs = decode_step_costs(tiny_llama, batch_size=3, context=20, block_size=4, steps=3)
    parts = ("table_build", "gather", "rest")
    assert sum(costs[f"{p}_share"] for p in parts) == pytest.approx(1.0)
    assert all(costs[f"{p}_s"] >= 0 for p in parts) and costs["gather_s"] > 0 and costs["table_build_s"] > 0
    assert costs["timed_step_s"] == pytest.approx(sum(costs[f"{p}_s"] for p in parts))
    for name in ("step_s", "pool_step_s", "table_build_lists_s", "gather_by_slots_s", "paged_kernel_step_s"):
        assert costs[name] > 0
    assert all(isinstance(t, Timing) and len(t.samples) == 3 for t in costs["timings"].values())
    assert costs["timings"]["step"].median == costs["step_s"]
    busy_reason(costs["timings"], load=None)                  # the figures can go through the busy probe
    assert costs["batch_size"] == 3 and costs["context"] == 20


def test_the_timed_step_never_waits_for_the_device_inside_a_layer(monkeypatch):
    """On a GPU a synchronize around every layer's gather would time a slower step than the one
    the engine runs: the device is synchronized the same number of times whatever the layers."""
    import dataclasses

    from labsupport.engine.models.transformer import Transformer
    from labsupport.lab import serving_decode_cost
    from labsupport.weights.fixtures import random_model
    calls = []
    real = serving_decode_cost.synchronize
    monkeypatch.setattr(serving_decode_cost, "synchronize", lambda device: (calls.append(1), real(device)))
    counts = []
    for layers in (2, 6):
        config = dataclasses.replace(random_model("tiny-llama").config, num_layers=layers)
        torch.manual_seed(0)
        calls.clear()
        decode_step_costs(Transformer(config).eval(), batch_size=2, context=8, block_size=4, steps=2)
        counts.append(len(calls))
    assert counts[0] == counts[1], counts


def test_the_interval_clock_adds_up_host_intervals_on_a_cpu():
    from labsupport.lab.serving_decode_cost import IntervalClock
    clock = IntervalClock("cpu")
    assert clock.measure(lambda: 7) == 7 and clock.measure(lambda: sum(range(1000))) == 499500
    assert clock.total() > 0 and clock.events == []


@pytest.mark.parametrize("kwargs, message", [
    ({"context": 10 ** 6}, r"context .* must be from 1 to \d+, got 1000000"),
    ({"batch_size": 0}, "batch_size .* must be at least 1"),
    ({"steps": 1.5}, "steps .* must be a whole number"),
])
def test_decode_step_costs_refuses_bad_input(tiny_llama, kwargs, message):
    with pytest.raises(LabError, match=message):
        decode_step_costs(tiny_llama, **kwargs)


def test_an_unknown_attention_path_is_refused(tiny_llama):
    cache = PagedKVCache(tiny_llama.config, 4, 4)
    with pytest.raises(LabError, match="attention must be 'gather' or 'pool', got 'flash'"):
        ModelRunner(tiny_llama, cache, BlockManager(4, 4), attention="flash")


def test_the_reader_is_chosen_once_and_every_pass_reads_through_it(tiny_model_f64):
    from labsupport.engine.serving.paged_cache import PagedView
    gathers = []

    class CountingView(PagedView):
        def gather(self, layer):
            gathers.append(layer)
            return PagedView.gather(self, layer)
    blocks = BlockManager(num_blocks=40, block_size=4)
    cache = PagedKVCache(tiny_model_f64.config, 40, 4, dtype=tiny_model_f64.dtype)
    counted = ModelRunner(tiny_model_f64, cache, blocks, reader=CountingView)
    seqs = _ragged_state(tiny_model_f64, blocks, counted)
    logits = counted.forward(seqs, [1, 3, 2])
    assert gathers == list(range(tiny_model_f64.config.num_layers))         # one gather per layer, one pass
    plain = ModelRunner(tiny_model_f64, cache, blocks).forward(seqs, [1, 3, 2])   # the same pass again
    torch.testing.assert_close(logits, plain, rtol=0, atol=0)


def test_blocks_that_are_not_a_block_manager_are_refused(tiny_llama):
    cache, blocks = PagedKVCache(tiny_llama.config, 4, 4), BlockManager(4, 4)
    with pytest.raises(LabError, match="blocks must be the BlockManager of the pool's blocks, got method"):
        ModelRunner(tiny_llama, cache, blocks.table)


@pytest.mark.parametrize("reader", [dict, "gather", None])
def test_a_reader_that_is_not_a_paged_view_is_refused(tiny_llama, reader):
    cache = PagedKVCache(tiny_llama.config, 4, 4)
    with pytest.raises(LabError, match="reader must be PagedView or a subclass of it"):
        ModelRunner(tiny_llama, cache, BlockManager(4, 4), reader=reader)
