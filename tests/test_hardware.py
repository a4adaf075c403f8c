"""Tests for labsupport.engine.hardware: device and dtype choice, the probe, the roofline."""

import pytest
import torch

from labsupport.engine import hardware
from labsupport.errors import LabError, UnsupportedDtype
from labsupport.lab import measure, roofs
from labsupport.lab.measure import Timing
from labsupport.lab.roofs import HardwareProfile, measure_bandwidth, measure_matmul_flops, probe
from labsupport.engine.hardware import (bf16_supported, require_usable_dtype, device_name, fp16_fast,
                                        pick_device, pick_dtype, synchronize)

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


@pytest.fixture
def no_gpu(monkeypatch):
    """Pretend no CUDA GPU and no Apple GPU is visible, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "_mps_available", lambda: False)


def fake_gpu(monkeypatch, capability, name):
    """Pretend one CUDA GPU with this compute capability and name is visible."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def fake_cpu(monkeypatch, bf16=False, amx=False, amx_fp16=False):
    """Pretend the CPU has (or lacks) the bfloat16 / AMX instructions (and that the
    LABSUPPORT_NO_BF16 switch, under which CI runs these tests too, is off)."""
    monkeypatch.delenv(hardware.NO_BF16_SWITCH, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: amx_fp16, raising=False)


def assert_one_sentence(message):
    assert "\n" not in message
    assert message.endswith(".")
    assert ". " not in message, f"more than one sentence: {message!r}"


# ---------------------------------------------------------------- pick_device


def test_pick_device_without_gpu_is_cpu(no_gpu):
    assert pick_device() == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")


def test_pick_device_prefers_cuda_when_visible(monkeypatch):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    assert pick_device() == torch.device("cuda")
    assert pick_device("cuda:0") == torch.device("cuda:0")


def test_pick_device_cuda_without_gpu_raises(no_gpu):
    with pytest.raises(LabError, match="no GPU is visible") as info:
        pick_device("cuda")
    assert_one_sentence(str(info.value))


def test_pick_device_rejects_missing_gpu_index(monkeypatch):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    with pytest.raises(LabError, match="cuda:0"):
        pick_device("cuda:3")


def test_pick_device_rejects_unknown_names(no_gpu):
    with pytest.raises(LabError, match="Unknown device"):
        pick_device("gpu")
    with pytest.raises(LabError, match="not available"):
        pick_device("mps")


# ---------------------------------------------------------------- dtypes


def test_bf16_not_supported_on_t4(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert bf16_supported("cuda") is False
    assert pick_dtype("cuda") == torch.float16


def test_bf16_supported_on_ampere(monkeypatch):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    assert bf16_supported("cuda") is True
    assert pick_dtype("cuda") == torch.bfloat16
    require_usable_dtype("cuda", torch.bfloat16)  # no error


def test_bf16_on_cpu_follows_instructions(monkeypatch):
    fake_cpu(monkeypatch, bf16=False, amx=False)
    assert bf16_supported("cpu") is False
    assert pick_dtype("cpu") == torch.float32
    fake_cpu(monkeypatch, bf16=True)
    assert bf16_supported("cpu") is True
    assert pick_dtype("cpu") == torch.bfloat16
    fake_cpu(monkeypatch, amx=True)
    assert bf16_supported("cpu") is True


def test_older_torch_without_cpu_queries_means_no_bf16(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert bf16_supported("cpu") is False
    assert fp16_fast("cpu") is False


def test_fp16_fast(monkeypatch):
    fake_cpu(monkeypatch, amx_fp16=False)
    assert fp16_fast("cpu") is False
    fake_cpu(monkeypatch, amx_fp16=True)
    assert fp16_fast("cpu") is True
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert fp16_fast("cuda") is True


@pytest.mark.parametrize("capability, name, fast", [((6, 1), "NVIDIA GeForce GTX 1080", False),
                                                    ((6, 0), "Tesla P100-PCIE-16GB", True),
                                                    ((5, 2), "NVIDIA GeForce GTX 980", False),
                                                    ((8, 9), "NVIDIA L4", True)])
def test_fp16_is_fast_from_volta_and_on_the_p100_not_on_consumer_pascal(monkeypatch, capability, name, fast):
    """A GTX 10xx (6.1) runs float16 at 1/64 of its float32 rate (issue 52: notebook 03 said every CUDA GPU)."""
    fake_gpu(monkeypatch, capability, name)
    assert fp16_fast("cuda") is fast


def test_check_dtype_bf16_on_t4_names_gpu_and_fix(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(UnsupportedDtype) as info:
        require_usable_dtype("cuda", torch.bfloat16)
    message = str(info.value)
    assert "Tesla T4" in message and "7.5" in message and "float16" in message
    assert_one_sentence(message)
    require_usable_dtype("cuda", torch.float16)  # no error


def test_check_dtype_bf16_on_plain_cpu_is_allowed_and_labelled_emulated(monkeypatch):
    fake_cpu(monkeypatch, bf16=False, amx=False)
    require_usable_dtype("cpu", "bfloat16")                      # runs, emulated: same bits, lower speed
    assert hardware.bf16_emulated("cpu") is True
    assert hardware.dtype_label("cpu", torch.bfloat16) == "bfloat16 (emulated)"
    assert hardware.dtype_label("cpu", torch.float32) == "float32"
    fake_cpu(monkeypatch, bf16=True)
    assert hardware.bf16_emulated("cpu") is False
    assert hardware.dtype_label("cpu", "bfloat16") == "bfloat16"


@pytest.mark.parametrize("value, off", [("1", True), ("yes", True), ("0", False), ("", False), ("false", False)])
def test_the_no_bf16_switch_hides_bf16_instructions(monkeypatch, no_gpu, value, off):
    fake_cpu(monkeypatch, bf16=True, amx=True)
    monkeypatch.setenv(hardware.NO_BF16_SWITCH, value)
    assert bf16_supported("cpu") is (not off)
    assert hardware.bf16_emulated("cpu") is off
    assert pick_dtype("cpu") == (torch.float32 if off else torch.bfloat16)
    require_usable_dtype("cpu", torch.bfloat16)                  # allowed either way


def test_the_switch_does_not_touch_a_gpu(monkeypatch):
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    monkeypatch.setenv(hardware.NO_BF16_SWITCH, "1")
    assert bf16_supported("cuda") is True and hardware.bf16_emulated("cuda") is False


def test_check_dtype_allows_fp16_and_fp32_on_cpu():
    require_usable_dtype("cpu", torch.float16)
    require_usable_dtype("cpu", torch.float32)
    require_usable_dtype("cpu", "torch.float32")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, "int4_nonsense"])
def test_check_dtype_rejects_non_model_dtypes(dtype):
    with pytest.raises(UnsupportedDtype) as info:
        require_usable_dtype("cpu", dtype)
    message = str(info.value)
    assert "torch.float32, torch.float16 or torch.bfloat16" in message
    assert_one_sentence(message)


# ---------------------------------------------------------------- small helpers


def test_synchronize_on_cpu_is_a_no_op():
    assert synchronize("cpu") is None


def test_device_name_on_cpu_shows_threads():
    name = device_name("cpu")
    assert name.endswith(f"({torch.get_num_threads()} threads)")
    assert len(name) > len("( threads)") + 1


# ---------------------------------------------------------------- measurements


def test_bandwidth_is_in_a_sane_range():
    bandwidth = measure_bandwidth("cpu", nbytes=32 * 2**20, repeats=3)
    assert 1e8 < bandwidth < 1e13


def test_bandwidth_counts_read_and_write(monkeypatch):
    """One copy of nbytes taking 1 s must report 2 x nbytes per second."""

    clock = iter(range(1000))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: float(next(clock)))
    assert measure_bandwidth("cpu", nbytes=1000, repeats=3) == pytest.approx(2000.0)


def test_matmul_flops_positive_and_sane():
    flops = measure_matmul_flops("cpu", torch.float32, n=256, repeats=3)
    assert 1e7 < flops < 1e15


def test_matmul_flops_counts_2n_cubed(monkeypatch):

    clock = iter(range(1000))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: float(next(clock)))
    assert measure_matmul_flops("cpu", "float32", n=16, repeats=3) == pytest.approx(2 * 16**3)


# ---------------------------------------------------------------- profile and roofline


def test_profile_ridge_and_attainable():
    profile = HardwareProfile(device="cpu", name="test", bandwidth=1e10, flops={"float32": 1e11})
    assert profile.ridge(torch.float32) == pytest.approx(10.0)
    assert profile.ridge("float32") == pytest.approx(10.0)
    assert profile.attainable(1.0, "float32") == pytest.approx(1e10)  # memory-bound
    assert profile.attainable(10.0, "float32") == pytest.approx(1e11)  # at the ridge
    assert profile.attainable(1000.0, "float32") == pytest.approx(1e11)  # compute-bound
    assert profile.to_dict() == {
        "device": "cpu",
        "name": "test",
        "bandwidth": 1e10,
        "flops": {"float32": 1e11},
        "bandwidth_spread": 0.0,
        "read_bandwidth": 0.0,                       # not measured (a read probe, issue 54)
    }
    with pytest.raises(LabError, match="not measured"):
        profile.ridge(torch.bfloat16)


def test_probe_measures_and_memoizes(monkeypatch):
    monkeypatch.setattr(roofs, "_PROBE_CACHE", {})
    monkeypatch.setattr(roofs, "CPU_COPY_BYTES", 32 * 2**20)  # keep the test quick
    profile = probe("cpu", dtypes=[torch.float32])
    assert profile.device == "cpu"
    assert 1e8 < profile.bandwidth < 1e13
    assert 1e8 < profile.read_bandwidth < 1e13 and ", read " in str(profile)     # the read probe (issue 54)
    assert list(profile.flops) == ["float32"]
    assert profile.ridge("float32") == pytest.approx(profile.flops["float32"] / profile.bandwidth)
    assert "float32" in str(profile)

    assert probe("cpu", dtypes=["float32"]) is profile  # remembered
    assert probe("cpu", dtypes=[torch.float32], refresh=True) is not profile


def test_probe_default_dtypes_follow_hardware(monkeypatch):
    monkeypatch.setattr(roofs, "_PROBE_CACHE", {})
    monkeypatch.setattr(roofs, "copy_timing", lambda device: (1000, Timing([2e-7] * 5)))
    monkeypatch.setattr(roofs, "measure_matmul_flops", lambda device, dtype: 1e11)
    fake_cpu(monkeypatch, bf16=False)
    assert list(probe("cpu").flops) == ["float32"]
    fake_cpu(monkeypatch, bf16=True)
    assert list(probe("cpu").flops) == ["float32", "bfloat16"]


def test_probe_keeps_the_copies_median_and_spread(monkeypatch):
    """The bandwidth is the median copy; its spread (IQR / median) is kept beside it and printed."""
    monkeypatch.setattr(roofs, "_PROBE_CACHE", {})
    copies = Timing([1.0, 1.0, 1.0, 2.0, 4.0])             # seconds; median 1, IQR 1
    monkeypatch.setattr(roofs, "copy_timing", lambda device: (1000, copies))
    monkeypatch.setattr(roofs, "read_timing", lambda device, nbytes: (nbytes, Timing([0.5, 0.5, 0.6])))
    monkeypatch.setattr(roofs, "measure_matmul_flops", lambda device, dtype: 1e11)
    profile = probe("cpu", dtypes=["float32"])
    assert profile.bandwidth == pytest.approx(2000.0)         # 2 x 1000 bytes in the median second
    assert profile.read_bandwidth == pytest.approx(2000.0)    # 1000 bytes read in the median 0.5 s
    assert profile.bandwidth_spread == pytest.approx(1.0)
    assert "±50%" in str(profile)


def test_probe_refuses_dtypes_the_device_cannot_run(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(UnsupportedDtype, match="Tesla T4"):
        probe("cuda", dtypes=[torch.bfloat16])
    with pytest.raises(UnsupportedDtype):
        probe("cpu", dtypes=[torch.int8])


# ---------------------------------------------------------------- untested platforms


def test_an_apple_gpu_is_never_picked_by_itself(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "_mps_available", lambda: True)
    monkeypatch.delenv(hardware.UNTESTED_SWITCH, raising=False)
    assert pick_device() == torch.device("cpu")
    with pytest.raises(LabError, match="never been run on the Apple GPU") as info:
        pick_device("mps")
    assert_one_sentence(str(info.value))
    monkeypatch.setenv(hardware.UNTESTED_SWITCH, "1")
    assert pick_device() == torch.device("mps") == pick_device("mps")


def test_native_windows_is_refused_in_one_sentence(monkeypatch):
    monkeypatch.delenv(hardware.UNTESTED_SWITCH, raising=False)
    monkeypatch.setattr(hardware.sys, "platform", "win32")
    with pytest.raises(LabError, match="WSL2") as info:
        hardware.require_supported_platform()
    assert_one_sentence(str(info.value))
    monkeypatch.setenv(hardware.UNTESTED_SWITCH, "1")
    hardware.require_supported_platform()
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    monkeypatch.delenv(hardware.UNTESTED_SWITCH)
    hardware.require_supported_platform()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_probe_on_cuda():
    profile = probe("cuda", refresh=True)
    assert profile.bandwidth > 1e11
    assert {"float32", "float16"} <= set(profile.flops)
    assert profile.flops["float16"] > profile.flops["float32"]
    assert ("bfloat16" in profile.flops) == bf16_supported("cuda")
    assert pick_dtype("cuda") in (torch.bfloat16, torch.float16)


def test_a_slow_fp16_gpu_skips_the_long_fp16_prefill_and_says_why(monkeypatch):
    from labsupport.lab.precision import speed_skip_reason
    fake_gpu(monkeypatch, (6, 1), "NVIDIA GeForce GTX 1080")
    assert "1/64" in speed_skip_reason("cuda", torch.float16, "prefill")
    assert speed_skip_reason("cuda", torch.float16, "decode") is None
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert speed_skip_reason("cuda", torch.float16, "prefill") is None
