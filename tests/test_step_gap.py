"""labsupport.lab.roofline_step_gap: a batch-1 decode step against the time its bytes take at the
read bandwidth, and the rest split into parts (issue 54's breakdown, notebooks 00 and 04)."""

import pytest
import torch

from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.errors import LabError
from labsupport.lab import roofline_step_gap as gap_module
from labsupport.lab.roofline_step_gap import PARTS, decode_gap, gap_sentences
from labsupport.lab.roofline_step_profile import profile_decode_step
from labsupport.lab.roofs import fork_join_seconds

pytestmark = pytest.mark.platform    # the profiler and torch's threads: a torch version can break these


def weight_matrices(model) -> int:
    """The matmuls of one eager step: every nn.Linear, and the output head where it is the tied embedding."""
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    return linears + (0 if any(isinstance(m, torch.nn.Linear) and m.weight is model.embed.weight
                               for m in model.modules()) else 1)


def test_the_parts_add_up_to_the_step_and_the_floor_is_the_bytes_over_the_read_bandwidth(tiny_llama):
    gap = decode_gap(tiny_llama, context=16, steps=3)
    assert list(gap["parts"]) == list(PARTS) and all(v >= 0 for v in gap["parts"].values())
    nbytes = tiny_llama.weight_bytes() + kv_cache_bytes(tiny_llama.config, 17, 1, torch.float32)
    assert gap["bytes"] == nbytes
    assert gap["parts"]["reading the bytes"] == pytest.approx(nbytes / gap["read_bandwidth"])
    assert gap["fraction"] == pytest.approx(gap["parts"]["reading the bytes"] / gap["step_seconds"])
    if gap["parts"]["Python and dispatch"] > 0:          # else the profiled operators already exceed the step
        assert sum(gap["parts"].values()) == pytest.approx(gap["step_seconds"])
    assert gap["parts"]["thread wake-ups"] == pytest.approx(gap["fork_join_seconds"] * gap["matmul_calls"])
    assert gap["layers"] == tiny_llama.config.num_layers
    assert gap["matmul_floor_per_layer"] * gap["layers"] == pytest.approx(
        tiny_llama.weight_bytes() / gap["read_bandwidth"])


def test_a_matmul_call_is_one_weight_matrix_not_its_wrappers(tiny_llama):
    """aten::linear calls aten::mm: counting both would count each wake-up twice or three times."""
    result = profile_decode_step(tiny_llama, batch=1, context=8, steps=2)
    assert result["calls"]["matmuls"] == weight_matrices(tiny_llama)


def test_the_int4_step_counts_the_w4a8_calls_and_its_packed_bytes(fresh_tiny_llama):
    from labsupport.engine.quant import quantize_model, w4a8
    kernel = "w4a8" if w4a8.w4a8_unavailable() is None else "fast"
    dense, matrices = fresh_tiny_llama.weight_bytes(), weight_matrices(fresh_tiny_llama)
    with quantize_model(fresh_tiny_llama, "int4", group_size=32, kernel=kernel):    # the head too
        gap = decode_gap(fresh_tiny_llama, context=8, steps=2)
    assert gap["bytes"] < dense
    assert gap["matmul_calls"] == matrices          # one quantized kernel call per weight matrix


def test_a_wake_up_is_measured_on_several_threads_and_is_zero_on_one():
    threads = torch.get_num_threads()
    assert fork_join_seconds(repeats=50) >= 0
    torch.set_num_threads(1)
    try:
        assert fork_join_seconds(repeats=50) == 0.0
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads               # the probe gives its threads back


def test_the_sentences_name_the_floor_each_part_and_the_largest(tiny_llama):
    gap = decode_gap(tiny_llama, context=4, steps=2)
    gap["parts"] = dict(zip(PARTS, (1e-3, 2e-3, 5e-3, 1e-3, 0.5e-3)))
    text = "\n".join(gap_sentences("tiny", gap))
    assert text.startswith("tiny: ") and all(part in text for part in PARTS)
    assert text.endswith("The largest part past the floor: thread wake-ups.")


@pytest.mark.parametrize("kwargs, words", [({"context": -1}, "context"), ({"steps": 0}, "steps"),
                                           ({"context": 10**6}, "context")])
def test_bad_arguments_are_refused_in_one_sentence(tiny_llama, kwargs, words):
    with pytest.raises(LabError, match=words):
        decode_gap(tiny_llama, **kwargs)


def test_a_model_off_the_cpu_is_refused_in_one_sentence(tiny_llama, monkeypatch):
    monkeypatch.setattr(type(tiny_llama), "device", property(lambda self: torch.device("cuda")))
    with pytest.raises(LabError, match="splits a CPU step"):
        decode_gap(tiny_llama)


def test_the_figure_stacks_every_part_in_milliseconds(tiny_llama):
    from labsupport.plots.engines import step_gap_figure
    gap = decode_gap(tiny_llama, context=4, steps=2)
    fig = step_gap_figure({"a": gap, "b": gap})
    assert [trace.name for trace in fig.data] == list(PARTS)
    assert list(fig.data[0].x) == [pytest.approx(1e3 * gap["parts"][PARTS[0]])] * 2
    with pytest.raises(LabError, match="at least one"):
        step_gap_figure({})


def test_the_module_reads_in_the_order_of_its_parts():
    assert gap_module.PARTS[0] == "reading the bytes" and gap_module.PARTS[-1] == "Python and dispatch"
