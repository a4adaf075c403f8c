"""Notebook 04: what a quantized model holds and reads, the kernel each layer runs, zero's
round trip, odd widths in the packing, the packing diagram and the explorer's two ratios."""

import pytest
import torch
import torch.nn as nn

from labsupport.errors import LabError
from labsupport.engine.precision import tensor_bytes
from labsupport.engine.quant import Int4Linear, Int8Linear, kernel_description, pack_int4, quantize_model, unpack_int4
from labsupport.lab.quantization_error import weight_error_stats
from labsupport.engine.quant.w4a8 import w4a8_unavailable
from labsupport.lab.quality import quantized_bytes, resident_bytes

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


def test_odd_widths_pack_with_a_zero_nibble_and_unpack_to_their_length():
    q = torch.tensor([[3, 12, 9], [15, 0, 1]], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.tolist() == [[3 | 12 << 4, 9], [15, 1]]
    assert torch.equal(unpack_int4(packed, 3), q) and unpack_int4(packed).shape == (2, 4)
    for bad in (lambda: unpack_int4(packed, 7), lambda: pack_int4(torch.tensor([[16]])),
                lambda: pack_int4(torch.tensor([[0.5]]))):
        with pytest.raises(LabError):
            bad()


def test_zero_survives_the_symmetric_grid_not_the_asymmetric_one():
    w = torch.tensor([[-0.31, 0.0, 0.17, 0.52] * 8])                    # one row, a zero in each group of 4
    int8 = weight_error_stats(w, "int8")["error"]
    int4 = weight_error_stats(w, "int4", group_size=4)["error"]
    assert int8[0, 1] == 0                                                 # 0 is a point of -127..127 x scale
    assert int4[0, 1] != 0                                                 # the grid starts at the group minimum


def test_resident_bytes_keep_the_float_embedding_the_step_does_not_read(fresh_tiny_llama):
    model = fresh_tiny_llama
    fp32_resident = resident_bytes(model)
    assert fp32_resident == tensor_bytes(model)
    with quantize_model(model, "int4", group_size=32):
        resident, read = resident_bytes(model), quantized_bytes(model)
        embedding = model.embed.weight.nbytes
        assert resident >= read + embedding                                # the tied embedding stays float
    assert resident < fp32_resident


def test_each_layer_names_its_kernel():
    linear = nn.Linear(64, 32)
    fast8, fast4 = Int8Linear.from_linear(linear), Int4Linear.from_linear(linear, group_size=32, kernel="fast")
    reference = Int4Linear.from_linear(linear, group_size=32, kernel="reference")
    assert kernel_description(fast8) == "fused int8 kernel (aten._weight_int8pack_mm, bf16 arithmetic)"
    assert kernel_description(fast4).startswith("fused int4 kernel (aten._weight_int4pack_mm_for_cpu")
    auto4 = Int4Linear.from_linear(linear, group_size=32)                 # ours where it builds (here it does)
    assert w4a8_unavailable() is None
    assert kernel_description(auto4).startswith("W4A8 kernel of our own (int4 weights x int8 activations")
    assert kernel_description(reference) == "reference path: dequantize int4 to float, then matmul"
    with pytest.warns(UserWarning):
        fallback = Int4Linear.from_linear(linear, group_size=16)          # no kernel for groups of 16
    assert "not usable here" in kernel_description(fallback)
    assert kernel_description(linear) == "dense matmul"


def test_the_handle_describes_its_kernels(fresh_tiny_llama):
    handle = quantize_model(fresh_tiny_llama, "int8")
    assert handle.describe().startswith("fused int8 kernel")
    assert sum(handle.kernel_names.values()) == len(handle.swaps)
    handle.restore()


def test_packing_figure_shows_weights_integers_and_bytes():
    from labsupport.explorers.quantization import packing_figure
    group = torch.linspace(-0.5, 1.0, 32)
    fig = packing_figure(group, shown=8)
    texts = [a.text for a in fig.layout.annotations]
    assert "<b>0</b><br>0000" in texts                                    # the minimum is level 0
    assert sum("= " in t for t in texts) == 4                              # 8 values in 4 bytes
    title = fig.layout.title.text
    assert "scale" in title and "zero" in title and "32 weights" in title


def test_the_explorer_times_against_fp32_and_bf16_and_names_the_kernel(fresh_tiny_llama):
    from labsupport.explorers.quantization import QuantizeLab
    from labsupport.weights.fixtures import ByteTokenizer
    lab = QuantizeLab(fresh_tiny_llama, ByteTokenizer(), new_tokens=3, eval_tokens=32, repeats=1)
    result = lab.measure(4, 32, "own")
    assert result["speedup"] > 0 and result["speedup_bf16"] > 0
    assert result["kernel"].startswith("W4A8 kernel of our own") and result["resident"] > result["memory"]


def _allocations(code: str) -> list[int]:
    """Element counts of every buffer the generated code allocates (`empty_strided_*((a, b, ...), ...)`)."""
    import math
    import re
    shapes = re.findall(r"empty_strided_\w+\(\(([\d, ]*)\)", code)
    return [math.prod(int(d) for d in s.replace(" ", "").split(",") if d) for s in shapes]


@pytest.mark.parametrize("rows", [1, 4])
def test_int8_on_cuda_is_one_reduction_that_never_writes_a_float_weight(rows):
    """The CUDA int8 path (`_int8_weight_only_mm`, compiled) is written so that the int8 -> float
    conversion fuses into the reduction; inductor's scheduler does the same on a CPU, so its
    generated code here shows it: the output is the only buffer, no (out, in) float weight."""
    from torch._inductor.utils import run_and_get_code

    from labsupport.engine.quant.formats import quantize_int8_absmax
    from labsupport.engine.quant.kernels import _int8_weight_only_mm
    torch.manual_seed(0)
    w = torch.randn(96, 64)
    q, scales = quantize_int8_absmax(w)
    x = torch.randn(rows, 64)
    torch._dynamo.reset()
    y, codes = run_and_get_code(torch.compile(_int8_weight_only_mm, dynamic=False), x, q, scales)
    torch.testing.assert_close(y, x @ (q.float() * scales[:, None]).T, rtol=1e-5, atol=1e-5)
    sizes = [n for code in codes for n in _allocations(code)]
    assert sizes and max(sizes) == rows * 96, f"buffers allocated: {sizes}"       # only the (rows, out) output


def test_int8_for_a_batch_that_computes_is_the_matmul():
    from labsupport.engine.quant.formats import quantize_int8_absmax
    from labsupport.engine.quant.kernels import INT8_REDUCTION_ROWS, _int8_weight_only_mm
    w = torch.randn(32, 16)
    q, scales = quantize_int8_absmax(w)
    x = torch.randn(INT8_REDUCTION_ROWS + 1, 16)
    torch.testing.assert_close(_int8_weight_only_mm(x, q, scales), x @ (q.float() * scales[:, None]).T,
                               rtol=1e-4, atol=1e-4)
