"""labsupport.lab.roofline_step_profile: one decode step split by kind of work (torch.profiler)."""

import pytest

from labsupport.errors import LabError
from labsupport.lab.roofline_step_profile import KINDS, kind_of, profile_decode_step

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def test_operators_are_sorted_into_kinds():
    assert kind_of("aten::addmm") == kind_of("aten::_weight_int4pack_mm_for_cpu") == "matmuls"
    assert kind_of("labsupport::w4a8_linear") == "matmuls"                    # our W4A8 kernel
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind_of("labsupport::attend_one_row") == "attention"               # inside fused.decode_block
    assert kind_of("aten::argmax") == "sampling"
    assert kind_of("aten::rsqrt") == kind_of("aten::index_copy_") == "norms and elementwise"
    assert kind_of("aten::as_strided") == kind_of("aten::transpose") == "framework and Python"


def test_one_step_is_split_into_every_kind_and_adds_up(tiny_llama):
    result = profile_decode_step(tiny_llama, batch=2, context=16, steps=3)
    assert list(result["seconds"]) == list(KINDS)
    assert result["seconds"]["matmuls"] > 0 and result["seconds"]["attention"] > 0
    assert result["seconds"]["sampling"] > 0                        # the argmax of the greedy pick
    assert sum(result["share"].values()) == pytest.approx(1.0)
    assert sum(result["seconds"].values()) == pytest.approx(result["profiled_step_seconds"], rel=0.05)
    assert result["step_seconds"] > 0
    assert result["top"] and all(op["kind"] in KINDS for op in result["top"])


def test_a_custom_step_is_profiled_instead(tiny_llama):
    calls = []
    result = profile_decode_step(tiny_llama, batch=1, context=4, steps=2,
                                 step_fn=lambda model, cache, tokens: calls.append(tokens.shape))
    assert calls and result["seconds"]["matmuls"] == 0


@pytest.mark.parametrize("batch, steps", [(0, 3), (2, 0), (1.5, 3)])
def test_bad_counts_are_refused_in_one_sentence(tiny_llama, batch, steps):
    with pytest.raises(LabError, match="whole numbers"):
        profile_decode_step(tiny_llama, batch=batch, steps=steps)


def test_the_figure_stacks_every_kind_for_every_step(tiny_llama):
    from labsupport.plots.roofline import step_profile_figure
    one = profile_decode_step(tiny_llama, batch=1, context=8, steps=2)
    fig = step_profile_figure({"batch 1": one, "batch 1 again": one})
    assert [trace.name for trace in fig.data] == list(KINDS)
    assert all(list(trace.y) == ["batch 1", "batch 1 again"] for trace in fig.data)
    with pytest.raises(LabError, match="at least one"):
        step_profile_figure({})


def test_the_compiled_step_is_profiled_with_the_same_kinds(fresh_tiny_llama):
    """The compiled step (what generate(compile=True) runs) splits into the same kinds; its
    matmuls are still there, and its step is timed without the profiler, after warm-up."""
    from labsupport.lab.roofline_step_profile import compiled_greedy_step
    result = profile_decode_step(fresh_tiny_llama, batch=2, context=8, steps=2, step_fn=compiled_greedy_step)
    assert list(result["seconds"]) == list(KINDS)
    assert sum(result["share"].values()) == pytest.approx(1.0)
    assert result["seconds"]["matmuls"] > 0 and result["step_seconds"] > 0
    assert not any(name.startswith("_compiled") for name in vars(fresh_tiny_llama))   # nothing set on the model
    from labsupport.engine.compiled import SHARED
    assert fresh_tiny_llama in SHARED._paths                                         # the decoder keeps the state
