"""The serving engine's decode steps replayed as CUDA graphs (issue 35; decode_graphs.py).

No GPU here: the graphs are "captured" by a stand-in that replays the captured function itself,
so that everything a graph depends on (its fixed buffers, padding rows, bucketed widths, the
fixed-width mask) runs for real on the CPU. The invariant: every request is served the tokens
(and the logits) the eager engine gives it. Tiny models in float64, so token equality is exact.
"""

from __future__ import annotations

import pytest
import torch

from labsupport.engine.graphs import CaptureFailed
from labsupport.engine.serving import BlockManager, Engine, PagedKVCache, Request, ServedSequence
from labsupport.engine.serving.decode_graphs import EAGER, GRAPHED, DecodeGraphs, buckets
from labsupport.engine.serving.model_runner import ModelRunner
from labsupport.errors import LabError

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


class EagerCapture:
    """Stands in for graphs.capture: the "replay" runs the captured step on its buffers."""

    def __init__(self, fail_at: int | None = None):
        self.captures, self.replays, self.pools, self.fail_at = 0, 0, set(), fail_at

    def __call__(self, fn, device, what, pool=None):
        self.captures += 1
        self.pools.add(pool)
        if self.captures == self.fail_at:
            raise CaptureFailed(f"{what} could not be captured as a CUDA graph (RuntimeError: host sync)")

        def replay():
            self.replays += 1
            return fn()
        return replay


def graphed(engine: Engine, capture: EagerCapture) -> Engine:
    """`engine` with decode graphs built by `capture` (what Engine builds on a GPU)."""
    engine.graphs = DecodeGraphs(ModelRunner(engine.model, engine.cache, None), engine.max_slots, capture)
    return engine


def workload(vocab: int, n: int = 6, new_tokens: int = 9) -> list[Request]:
    g = torch.Generator().manual_seed(1)
    lengths = [5, 17, 3, 12, 30, 4, 21, 6][:n]
    return [Request(torch.randint(0, vocab, (k,), generator=g).tolist(), max_new_tokens=new_tokens + i % 3,
                    arrival=i * 2, request_id=i) for i, k in enumerate(lengths)]


def test_buckets_are_powers_of_two_then_the_largest():
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(6) == [1, 2, 4, 6]


@pytest.mark.parametrize("options", [dict(policy="continuous"), dict(policy="static"),
                                     dict(token_budget=8), dict(prefix_caching=True), dict(max_slots=3)],
                         ids=["continuous", "static (padding rows)", "chunked prefill", "prefix caching", "3 slots"])
def test_graphed_decode_serves_the_eager_tokens(tiny_model_f64, options):
    options = {"max_slots": 4, "block_size": 4, **options}
    requests = workload(tiny_model_f64.config.vocab_size)
    eager = Engine(tiny_model_f64, **options).run(requests, clock="steps")
    capture = EagerCapture()
    engine = graphed(Engine(tiny_model_f64, **options), capture)
    served = engine.run(requests, clock="steps")
    assert served.tokens() == eager.tokens()
    assert served.decode_path == GRAPHED and served.decode_note is None and eager.decode_path == EAGER
    decode_steps = sum(1 for step in served.steps if step.decode_rows and not step.prefill_chunks)
    assert capture.replays >= decode_steps > 0                  # every decode-only step replayed a graph
    assert capture.captures == len(engine.graphs.row_buckets) * len(engine.graphs.width_buckets)


def test_a_windowed_model_is_served_windowed_by_its_graphs(tiny_model_f64):
    windowed = tiny_model_f64.with_attention_window(6)
    requests = workload(windowed.config.vocab_size, n=4, new_tokens=12)
    eager = Engine(windowed, max_slots=4, block_size=4).run(requests, clock="steps")
    served = graphed(Engine(windowed, max_slots=4, block_size=4), EagerCapture()).run(requests, clock="steps")
    unwindowed = Engine(tiny_model_f64, max_slots=4, block_size=4).run(requests, clock="steps")
    assert served.tokens() == eager.tokens() != unwindowed.tokens()


def test_replayed_logits_equal_the_eager_step_across_buckets(tiny_model_f64):
    """Rows at contexts 3..37 (widths 1 to 16 blocks of 4), 1 to 5 rows (buckets 1, 2, 4, 8)."""
    blocks = BlockManager(num_blocks=80, block_size=4)
    cache = PagedKVCache(tiny_model_f64.config, 80, 4, dtype=tiny_model_f64.dtype)
    runner = ModelRunner(tiny_model_f64, cache, blocks)
    graphs = DecodeGraphs(ModelRunner(tiny_model_f64, cache, None), 8, EagerCapture())
    g = torch.Generator().manual_seed(2)
    seqs = [ServedSequence(Request(torch.randint(0, 200, (k,), generator=g).tolist()), i, "cpu")
            for i, k in enumerate([3, 37, 9, 16, 22])]
    for seq in seqs:
        blocks.grow(seq.index, len(seq.tokens) + 1)
        runner.prefill(seq)
        seq.num_cached = len(seq.tokens)
        seq.output.append(7)
    for n in range(1, 6):
        rows = seqs[:n]
        eager = runner.forward(rows, [1] * n)
        runner.graphs = graphs                               # the same step again (the runner is pure), graphed
        replayed = runner.forward(rows, [1] * n)
        runner.graphs = None
        torch.testing.assert_close(replayed, eager, rtol=0, atol=1e-12)


def test_graphs_are_captured_once_per_engine_and_reused_by_every_run(tiny_model_f64):
    capture = EagerCapture()
    engine = graphed(Engine(tiny_model_f64, max_slots=2, block_size=8), capture)
    requests = workload(tiny_model_f64.config.vocab_size, n=3)
    first = engine.run(requests, clock="steps")
    captures = capture.captures
    assert engine.run(requests, clock="steps").tokens() == first.tokens() and capture.captures == captures
    assert len(capture.pools) == 1                           # one memory pool for every graph


def test_a_bucket_that_cannot_be_captured_is_said_and_the_engine_decodes_eagerly(tiny_model_f64):
    requests = workload(tiny_model_f64.config.vocab_size, n=3)
    eager = Engine(tiny_model_f64, max_slots=2, block_size=8).run(requests, clock="steps")
    with pytest.warns(UserWarning, match="decodes eagerly here: the serving decode step of .* could not be captured"):
        engine = graphed(Engine(tiny_model_f64, max_slots=2, block_size=8), EagerCapture(fail_at=3))
    served = engine.run(requests, clock="steps")
    assert served.tokens() == eager.tokens()
    assert served.decode_path == EAGER and "host sync" in served.decode_note and not engine.graphs.graphs


def test_cuda_graphs_argument_is_checked_in_one_sentence(tiny_model_f64):
    with pytest.raises(LabError, match="CUDA graphs replay GPU work, and this model is on cpu") as error:
        Engine(tiny_model_f64, cuda_graphs=True)
    assert str(error.value).count(". ") == 0
    with pytest.raises(LabError, match="cuda_graphs must be True or False"):
        Engine(tiny_model_f64, cuda_graphs="yes")
    engine = Engine(tiny_model_f64, cuda_graphs=None)        # a CPU: eager, said
    assert engine.graphs is None and engine.decode_path == EAGER and engine.decode_note is None


def test_a_fixed_read_width_refuses_the_pool_path(tiny_model_f64):
    cache = PagedKVCache(tiny_model_f64.config, 4, 4, dtype=tiny_model_f64.dtype)
    tables = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(LabError, match="fixed read width"):
        cache.view(tables, torch.zeros(1, 1, dtype=torch.long), 8, over_pool=True)



def test_a_graphed_serving_run_passes_as_a_gpu_figure_and_an_eager_one_fails():
    from labsupport.lab.measure import mark_graphed
    from simulated_gpu import GPUS, simulated
    with simulated(GPUS["H100"]):
        cuda = torch.device("cuda")
        assert mark_graphed({"met": True}, [GRAPHED], cuda)["graphed"] is True
        failed = mark_graphed({"met": True}, [GRAPHED, EAGER], cuda)
    assert failed["graphed"] is False and failed["met"] is None
