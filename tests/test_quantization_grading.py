"""Notebook 04's checkers grade the method, not only the numbers (issue 48): the W4A8 checker watches the
tensors a learner's code builds (`W4A8Watch`) and has a layer on which float32's float path is off; a call
of the package's compiled W4A8 kernel is refused; and an int8 answer built through torch's own nn.Linear
(the walk does not go into installed libraries, so it reaches Int8Linear; the other rows: tests/checker_cases/nb04_quantization.py)."""

import pytest
import torch
import torch.nn as nn

from labsupport.checks import CheckFailed
from labsupport.checks.quantization import check_int8_absmax
from labsupport.checks.quantization_w4a8 import _w4a8_cases, check_w4a8_matmul
from labsupport.engine.quant import Int8Linear, quantize_int4_groupwise, w4a8
from labsupport.lab.quantization_error import w4a8_reference

from checker_cases.nb04_quantization import dequantize, float_path_by_blocks, w4a8_matmul

pytestmark = pytest.mark.platform    # the W4A8 kernel and float32's rounding (tests/test_platform_marker.py)


def test_on_the_layer_far_from_zero_float32s_float_path_misses_and_the_integer_sums_do_not():
    x, w = _w4a8_cases()[-1]
    q, scales, mins = quantize_int4_groupwise(w, 32)
    scales, mins = scales.half().float(), mins.half().float()
    expected = w4a8_reference(x, *w4a8.pack_q4_1(q, scales, mins))
    tolerance = 1e-5 * expected.abs() + 1e-5 * expected.abs().max()          # the checker's
    integer, _ = w4a8_matmul(x, q, scales, mins)
    floats, _ = float_path_by_blocks(x, q, scales, mins)
    assert ((integer - expected).abs() <= tolerance).all()
    assert ((floats - expected).abs() > tolerance).any()


def test_the_notebooks_solution_passes(capsys):
    check_w4a8_matmul(w4a8_matmul)
    assert "Correct" in capsys.readouterr().out


def test_a_float_path_in_float64_is_refused_by_what_it_builds():
    with pytest.raises(CheckFailed, match="a float tensor of the dequantized"):
        check_w4a8_matmul(lambda *a: float_path_by_blocks(*a, dtype=torch.float64))


@pytest.mark.skipif(w4a8.w4a8_unavailable() is not None, reason="the W4A8 kernel does not build here")
def test_a_call_of_the_compiled_kernel_is_refused():
    def kernel(x, q, scales, mins):
        _, sums = w4a8_matmul(x, q, scales, mins)
        n, k = q.shape
        halves = q.to(torch.uint8).reshape(n, k // 32, 2, 16)
        packed = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2)
        return torch.ops.labsupport.w4a8_linear(x, packed, scales.half(), mins.half(), "auto"), sums
    with pytest.raises(CheckFailed, match="torch.ops.labsupport.w4a8_linear"):
        check_w4a8_matmul(kernel)


def quantize_by_an_nn_linear(w):
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w.clone()
    layer = Int8Linear.from_linear(linear, kernel="reference")
    return layer.weight_int8, layer.scales.float()


def test_an_int8_layer_built_from_an_nn_linear_is_refused():
    with pytest.raises(CheckFailed, match="expected your own code"):
        check_int8_absmax(quantize_by_an_nn_linear, dequantize)
