"""The course's W4A8 kernel (labsupport/engine/quant/w4a8.cpp, notebook 04) against its float reference.

The kernel's integer sums are exact, so it must equal `w4a8_reference` (a float64 matmul of the
same quantized weights and activations) up to float32 rounding of the scale terms: the tolerance
is 1e-5 of `w4a8_error_bound` (the sum of the terms' sizes). Every path this CPU runs is forced in
turn; a path the CPU lacks is skipped with the reason. The build itself is cached
(LABSUPPORT_CACHE/kernels), so only the first run of this file compiles (about 10-60 s).
"""

from __future__ import annotations

import re
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from labsupport.engine import cpp_build
from labsupport.engine.quant import w4a8
from labsupport.lab import quantization_error
from labsupport.errors import LabError
from labsupport.engine.quant.formats import dequantize_int4, quantize_int4_groupwise

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def kernel():
    """Build (or load) the kernel; skip without a compiler or ninja, fail if it does not compile."""
    reason = w4a8.w4a8_unavailable()
    if reason is not None:
        if "did not build" in reason:
            pytest.fail(f"the W4A8 kernel does not compile here: {reason}")
        pytest.skip(reason)
    return w4a8.supported_paths()


@pytest.fixture(params=w4a8.PATHS)
def path(request, kernel):
    if request.param not in kernel:
        pytest.skip(f"this CPU cannot run the {request.param} path (it runs {', '.join(kernel)})")
    return request.param


def packed_weight(n: int, k: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=generator) * 0.05
    return w, w4a8.pack_q4_1(*quantize_int4_groupwise(w, 32))


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


def assert_matches_reference(y, x, packed):
    ref, bound = quantization_error.w4a8_reference(x, *packed), quantization_error.w4a8_error_bound(x, *packed)
    assert y.shape == ref.shape and y.dtype == torch.float32
    worst = ((y - ref).abs() / bound.clamp(min=1e-30)).max().item() if y.numel() else 0.0
    assert worst <= TOLERANCE, f"kernel and reference differ by {worst:.2e} of the terms' size"


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and not re.search(r"\.\s", message[:-1])


# --- the kernel against the reference --------------------------------------------------------------

@pytest.mark.parametrize("k", [32, 64, 96, 160, 544, 576, 1536])   # 1, 2, 3, 5, 17, 18, 48 blocks
def test_every_path_matches_the_reference(path, k):
    for n in (1, 7, 49):
        _, packed = packed_weight(n, k, seed=k + n)
        for m in (1, 2, 3, 4, 5, 7, 8, 13, 16, 19):       # from 8 rows: the one-row-per-lane tiles
            x = activations(m, k, seed=m)
            assert_matches_reference(w4a8.w4a8_linear(x, *packed, path=path), x, packed)


def test_a_large_output_not_a_multiple_of_the_tile(path):
    n, k = 49152 + 7, 576                                    # the lm_head's shape, plus a ragged end
    _, packed = packed_weight(n, k)
    rows = torch.cat([torch.randperm(n, generator=torch.Generator().manual_seed(0))[:1500], torch.arange(n - 9, n)])
    for m in (1, 3, 13):
        x = activations(m, k)
        y = w4a8.w4a8_linear(x, *packed, path=path)          # (m, n)
        assert y.shape == (m, n)
        assert_matches_reference(y[:, rows], x, tuple(t[rows] for t in packed))


def test_many_rows_each_row_alone_and_in_any_batch(path):
    """Every row of a batch equals the row alone up to float rounding, and a row's result does not
    depend on the batch's other rows (bitwise) once the batch takes the same tiles: the 16-row tiles
    of avx512vnni from `gemm_min_rows()` rows, with ragged tiles (n = 37) and a prefill's 300 rows."""
    n, k = 37, 576
    _, packed = packed_weight(n, k)
    threshold = w4a8.gemm_min_rows()
    x = activations(300, k)
    y = w4a8.w4a8_linear(x, *packed, path=path)
    assert_matches_reference(y, x, packed)
    alone = torch.cat([w4a8.w4a8_linear(x[i:i + 1], *packed, path=path) for i in range(0, 300, 23)])
    torch.testing.assert_close(y[::23], alone, rtol=1e-5, atol=1e-5)
    other = torch.cat([x[:threshold], activations(threshold + 5, k, seed=9)])   # same first rows, others changed
    assert torch.equal(w4a8.w4a8_linear(other, *packed, path=path)[:threshold], y[:threshold])
    assert torch.equal(w4a8.w4a8_linear(x[:threshold], *packed, path=path), y[:threshold])


def test_leading_dimensions_other_dtypes_and_an_empty_batch(kernel):
    _, packed = packed_weight(33, 96)
    x = activations(6, 96).reshape(2, 3, 96)                 # (batch, seq, k)
    y = w4a8.w4a8_linear(x, *packed)
    assert y.shape == (2, 3, 33)
    assert_matches_reference(y.reshape(6, 33), x.reshape(6, 96), packed)
    y16 = w4a8.w4a8_linear(x.bfloat16(), *packed)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), quantization_error.w4a8_reference(x.bfloat16().float(), *packed), rtol=1e-2, atol=1e-2)
    transposed = activations(96, 4).t()                      # (4, 96), not contiguous
    assert_matches_reference(w4a8.w4a8_linear(transposed, *packed), transposed.contiguous(), packed)
    assert w4a8.w4a8_linear(torch.empty(0, 96), *packed).shape == (0, 33)


def test_thread_counts_give_identical_results(kernel):
    _, packed = packed_weight(4096 + 3, 576)                 # large enough to be split across threads
    x = activations(16, 576)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append([w4a8.w4a8_linear(x[:m], *packed) for m in (1, 2, 16)])
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results):
        assert torch.equal(one, two)


def test_the_environment_variable_forces_a_path(kernel, monkeypatch):
    _, packed = packed_weight(40, 160)
    x = activations(2, 160)
    monkeypatch.setenv("LABSUPPORT_W4A8_PATH", "portable")
    assert torch.equal(w4a8.w4a8_linear(x, *packed, path=None), w4a8.w4a8_linear(x, *packed, path="portable"))


def test_error_against_fp32_is_quantization_noise(kernel):
    w, packed = packed_weight(576, 1536)
    x = activations(4, 1536)
    y = w4a8.w4a8_linear(x, *packed)

    def relative(a, b):
        return ((a - b).norm() / b.norm()).item()

    exact = F.linear(x, w)                                   # fp32 weights and activations
    w4 = F.linear(x, dequantize_int4(*quantize_int4_groupwise(w, 32)))   # int4 weights, fp32 activations
    # int4 groups of 32 on Gaussian weights: about 8% of the output; int8 activations add ~1%
    assert 0.04 < relative(y, exact) < 0.12
    assert relative(y, w4) < 0.02
    assert relative(y, exact) < relative(w4, exact) + 0.01


def test_packing_layout_and_round_trip(kernel):
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    scales, mins = torch.rand(3, 2) + 0.1, -torch.rand(3, 2)
    packed, s16, m16 = w4a8.pack_q4_1(q, scales, mins)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8 and s16.dtype == m16.dtype == torch.float16
    assert int(packed[1, 16 + 5]) == int(q[1, 32 + 5]) | int(q[1, 32 + 16 + 5]) << 4    # block 1, byte 5
    assert torch.equal(w4a8.unpack_q4_1(packed), q)


# --- torch.compile traces through the fake implementation -----------------------------------------

def test_torch_compile_fullgraph_gives_the_same_output(kernel):
    _, packed = packed_weight(49, 96)
    x = activations(3, 96)

    def layer(x):
        return torch.ops.labsupport.w4a8_linear(x * 2, *packed, "auto").relu() + 1

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(x), layer(x))
    torch.library.opcheck(torch.ops.labsupport.w4a8_linear.default, (x, *packed, "auto"),
                          test_utils=("test_schema", "test_faketensor"))


# --- bad inputs: one LabError sentence, never a crash -----------------------------------------------

def bad_calls(packed):
    q, s, m = packed
    x = activations(2, 96)
    return {
        "integer x": lambda: w4a8.w4a8_linear(x.to(torch.int32), *packed),
        "k not a multiple of 32": lambda: w4a8.w4a8_linear(activations(2, 100), *packed),
        "k of another weight": lambda: w4a8.w4a8_linear(activations(2, 64), *packed),
        "float32 scales": lambda: w4a8.w4a8_linear(x, q, s.float(), m),
        "int32 packed": lambda: w4a8.w4a8_linear(x, q.to(torch.int32), s, m),
        "scales of another shape": lambda: w4a8.w4a8_linear(x, q, s[:, :2], m),
        "mins of other rows": lambda: w4a8.w4a8_linear(x, q, s, m[:3]),
        "1-D packed": lambda: w4a8.w4a8_linear(x, q.flatten(), s, m),
        "non-contiguous packed": lambda: w4a8.w4a8_linear(x, q.t().contiguous().t(), s, m),
        "0-D x": lambda: w4a8.w4a8_linear(torch.tensor(1.0), *packed),
        "unknown path": lambda: w4a8.w4a8_linear(x, *packed, path="sse9"),
        "pack: k not a multiple of 32": lambda: w4a8.pack_q4_1(torch.zeros(4, 100, dtype=torch.uint8),
                                                               torch.ones(4, 4), torch.zeros(4, 4)),
        "pack: a value of 16": lambda: w4a8.pack_q4_1(torch.full((4, 32), 16), torch.ones(4, 1), torch.zeros(4, 1)),
        "pack: float q": lambda: w4a8.pack_q4_1(torch.zeros(4, 32), torch.ones(4, 1), torch.zeros(4, 1)),
        "pack: scales of another shape": lambda: w4a8.pack_q4_1(torch.zeros(4, 64, dtype=torch.uint8),
                                                                torch.ones(4, 1), torch.zeros(4, 2)),
        "pack: a scale beyond fp16": lambda: w4a8.pack_q4_1(torch.zeros(1, 32, dtype=torch.uint8),
                                                            torch.full((1, 1), 1e6), torch.zeros(1, 1)),
    }


@pytest.mark.parametrize("case", list(bad_calls(packed_weight(8, 96)[1])))
def test_bad_inputs_raise_one_lab_error_sentence(kernel, case):
    with pytest.raises(LabError) as error:
        bad_calls(packed_weight(8, 96)[1])[case]()
    assert one_sentence(str(error.value)), str(error.value)


def test_a_path_this_cpu_lacks_is_refused_in_one_sentence(kernel):
    missing = [p for p in w4a8.PATHS if p not in kernel]
    if not missing:
        pytest.skip("this CPU runs every path")
    _, packed = packed_weight(8, 96)
    with pytest.raises(LabError, match="cannot run on this CPU") as error:
        w4a8.w4a8_linear(activations(1, 96), *packed, path=missing[0])
    assert one_sentence(str(error.value))


# --- the build: without a compiler, without ninja, or failing, one sentence and no kernel -----------

def assert_reason(reason, *words):
    assert reason is not None and "\n" not in reason and not re.search(r"\.\s", reason), reason
    for word in words:
        assert word in reason, reason


def test_no_compiler_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert_reason(w4a8._try_build(w4a8.SOURCE, tmp_path), "no C++ compiler")


def test_no_ninja_is_one_sentence(monkeypatch, tmp_path):
    if shutil.which("c++") is None:
        pytest.skip("no c++ here: the compiler is checked first")
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert_reason(w4a8._try_build(w4a8.SOURCE, tmp_path), "ninja")


def test_ninja_beside_this_python_is_found_without_an_activated_environment(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    ninja = tmp_path / "bin" / "ninja"
    ninja.write_text("#!/bin/sh\necho 1.11.1\n")
    ninja.chmod(0o755)
    monkeypatch.setattr(cpp_build.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    cpp_build.find_ninja()
    assert shutil.which("ninja") == str(ninja)
    cpp_build.find_ninja()                                            # found on PATH now: PATH left alone
    assert os.environ["PATH"].count(str(tmp_path / "bin")) == 1


def test_a_failing_build_is_one_sentence(tmp_path):
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("needs c++ and ninja to get as far as compiling")
    broken = tmp_path / "w4a8.cpp"
    broken.write_text('#include "no_such_header_w4a8.h"\n' + w4a8.SOURCE.read_text())
    reason = w4a8._try_build(broken, tmp_path / "kernels")
    assert_reason(reason, "did not build", "no_such_header_w4a8.h")


def test_a_nan_or_infinity_in_x_gives_nan_not_garbage(path):
    _, packed = packed_weight(9, 96)
    x = activations(3, 96)
    x[0, 40], x[1, 5] = float("nan"), float("inf")             # rows 0 and 1 poisoned, row 2 clean
    y = w4a8.w4a8_linear(x, *packed, path=path)
    assert y[:2].isnan().all()
    assert_matches_reference(y[2:], x[2:], packed)


def test_openmp_only_with_a_compiler_that_shares_torchs_runtime():
    # clang's OpenMP runtime is not the libgomp torch's Linux wheels bring: one thread, not two pools
    assert cpp_build.openmp_flags("clang++", "Debian clang version 14.0.6") == []


def test_the_path_follows_the_forced_one_then_torchs_own_cap(monkeypatch):
    monkeypatch.delenv("LABSUPPORT_W4A8_PATH", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert w4a8.default_path() == "auto"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")             # CI's AVX2-laptop simulation
    assert w4a8.default_path() == "avx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert w4a8.default_path() == "portable"
    monkeypatch.setenv("LABSUPPORT_W4A8_PATH", "avxvnni")         # the course's own switch wins
    assert w4a8.default_path() == "avxvnni"


def test_the_portable_only_build_compiles(kernel):
    """What an Arm CPU or Apple silicon builds: the x86 paths compiled out (W4A8_PORTABLE_ONLY), so
    nothing the portable build needs may live inside them (a constant once did). Syntax only."""
    import inspect
    import subprocess
    import sysconfig
    from torch.utils import cpp_extension
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    # the C++ standard this torch builds extensions with (c++17 up to some releases, c++20 since)
    standard = max(re.findall(r"-std=c\+\+(\d+)", inspect.getsource(cpp_extension)), key=int, default="17")
    result = subprocess.run([compiler, f"-std=c++{standard}", "-fsyntax-only", "-DW4A8_PORTABLE_ONLY",
                             *(f"-I{p}" for p in includes), str(w4a8.SOURCE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
