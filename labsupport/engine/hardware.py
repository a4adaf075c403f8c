"""What is this machine good at? A small hardware probe.

Introduced in notebook 00 (where the time goes). Text generation is limited
either by how fast memory can be read (bandwidth, bytes/s) or by how fast
the chip can multiply (FLOP/s). Notebook 00 measures both on the device you
actually have (`labsupport.lab.roofs.probe`, which uses this module's `synchronize`), so it
can draw a roofline from real numbers.

This module answers the practical questions every later notebook asks: which
device to use (`pick_device`), which dtype it runs well (`pick_dtype`,
`require_usable_dtype`), and how to wait for it to finish (`synchronize`).
Device and dtype always come from arguments; nothing here assumes a GPU.
"""

from __future__ import annotations

import os
import platform
import sys

import torch

from labsupport.errors import LabError, UnsupportedDtype

# The dtypes a model may be loaded in. Quantized formats are not listed:
# they store weights differently but still compute in one of these.
MODEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)



# --------------------------------------------------------------------------
# Choosing a device
# --------------------------------------------------------------------------


def _mps_available() -> bool:
    """True on an Apple-silicon Mac whose PyTorch can use the GPU (MPS)."""
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


# Paths the course has never run (nobody has run it on an Apple GPU or on Windows): they
# are refused in one sentence unless this switch is set, so a learner who opts in knows
# that what follows is untried.
UNTESTED_SWITCH = "LABSUPPORT_UNTESTED_PLATFORM"


def untested_platform_allowed() -> bool:
    """True when LABSUPPORT_UNTESTED_PLATFORM is set to anything but "", "0" or "false".
    Notebook 00 (where the time goes): the switch `require_supported_platform` reads."""
    return os.environ.get(UNTESTED_SWITCH, "").strip().lower() not in ("", "0", "false", "no")


def require_supported_platform() -> None:
    """Refuse Windows in one sentence (never run; WSL2 is Linux and works), unless the switch is set.

    Introduced in notebook 00 (where the time goes): `notebook_setup()` and the command
    line call it first.
    """
    if sys.platform == "win32" and not untested_platform_allowed():
        raise LabError("labsupport has never been run on native Windows; use WSL2 (Ubuntu) and follow "
                       f"the README there, or set {UNTESTED_SWITCH}=1 to try it anyway.")


def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """Return the device to compute on: the best one, or the one you asked for.

    Introduced in notebook 00 (where the time goes). With no argument the
    answer is "cuda" when a GPU is visible, else "cpu". An Apple GPU ("mps")
    is used only when LABSUPPORT_UNTESTED_PLATFORM=1: the course has never run
    there, so by default a Mac computes on its CPU. A `prefer` such as "cpu",
    "cuda" or "cuda:1" is checked, so a typo or a missing GPU gives a clear
    `LabError` instead of a crash deep inside a model. Every other function
    here accepts anything this one does. The first time it hands out a GPU of
    compute capability 9.0 or newer, it turns cuDNN attention off (`configure_attention`).
    """
    if prefer is None:
        if torch.cuda.is_available():
            configure_attention("cuda")
            return torch.device("cuda")
        if _mps_available() and untested_platform_allowed():
            return torch.device("mps")
        return torch.device("cpu")

    unknown = f"Unknown device {str(prefer)!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'."
    try:
        device = torch.device(prefer)
    except (RuntimeError, TypeError, ValueError):      # ValueError: an index past a C long, e.g. 2**63
        raise LabError(unknown) from None

    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LabError("CUDA was requested but no GPU is visible; use device='cpu' or a GPU runtime.")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise LabError(
                f"GPU {device.index} was requested but only {count} GPU(s) are visible; "
                f"use a device from 'cuda:0' to 'cuda:{count - 1}'."
            )
    elif device.type == "mps":
        if not _mps_available():
            raise LabError("The Apple GPU (mps) was requested but is not available here; use device='cpu'.")
        if not untested_platform_allowed():
            raise LabError("labsupport has never been run on the Apple GPU (mps); use device='cpu', "
                           f"or set {UNTESTED_SWITCH}=1 to try it anyway.")
    elif device.type != "cpu":
        raise LabError(unknown)
    if device.type == "cuda":
        configure_attention(device)
    return device


# cuDNN attention is torch 2.11's first SDPA choice from compute capability 9.0 (H100, H200:
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, priority_order), and it builds a plan
# for every new shape it meets (tens to hundreds of ms; every prefill length is a new shape).
# The course turns it off there, the first time `pick_device` hands out such a GPU; flash
# attention then runs. `torch.backends.cuda.enable_cudnn_sdp(True)` afterwards turns it back on.
CUDNN_ATTENTION_OFF_FROM = (9, 0)
_attention_configured = False


def cudnn_attention_off(device) -> bool:
    """True on a CUDA GPU of compute capability 9.0 or newer, where the course turns cuDNN
    attention off (`configure_attention`). Notebook 00 (where the time goes): the runtime line."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= CUDNN_ATTENTION_OFF_FROM


def configure_attention(device) -> None:
    """Once per process, on a GPU of compute capability 9.0 or newer: cuDNN attention off for
    every SDPA call (`torch.backends.cuda.enable_cudnn_sdp(False)`), as `cudnn_attention_off`
    says. `pick_device` calls it whenever it returns a CUDA device. Notebook 00 (where the time goes)."""
    global _attention_configured
    if _attention_configured or not cudnn_attention_off(device):
        return
    torch.backends.cuda.enable_cudnn_sdp(False)
    _attention_configured = True


def attention_note(device) -> str:
    """What `describe_runtime` says of attention: ", cuDNN attention off (...)" where the course
    turned it off, else "". Notebook 00 (where the time goes)."""
    if not cudnn_attention_off(device) or torch.backends.cuda.cudnn_sdp_enabled():
        return ""
    return (", cuDNN attention off (compute capability 9.0+: it builds a plan for every new prompt length; "
            "flash attention instead)")


def synchronize(device) -> None:
    """Wait until the device has finished all the work queued on it.

    Introduced in notebook 00 (where the time goes). GPUs run asynchronously:
    a call returns as soon as the work is queued, so a timer stopped without
    this measures almost nothing. On the CPU work is already finished when a
    call returns, so this does nothing.
    """
    device = pick_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo on Linux or `platform` elsewhere."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device) -> str:
    """A human-readable name: the GPU model, or the CPU model and its thread count.

    Introduced in notebook 00 (where the time goes). The CPU thread count is
    the one PyTorch will use (`torch.get_num_threads()`), which is what
    matters for speed, not how many cores the box has.
    """
    device = pick_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple GPU (mps, {platform.machine()})"
    return f"{_cpu_model()} ({torch.get_num_threads()} threads)"


# --------------------------------------------------------------------------
# Which dtypes does the hardware really run?
# --------------------------------------------------------------------------


def _cpu_feature(name: str) -> bool:
    """Ask PyTorch about a CPU feature; older PyTorch without the query says False."""
    query = getattr(torch.cpu, name, None)
    return bool(query()) if query is not None else False


# The switch that makes labsupport behave as on a CPU without bfloat16 instructions
# (the common AVX2-only laptop), on any machine: CI runs the tests under it, so both
# paths are tested wherever they run. To make torch itself use only AVX2 kernels too,
# also set ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 (see the README).
NO_BF16_SWITCH = "LABSUPPORT_NO_BF16"


def cpu_bf16_switched_off() -> bool:
    """True when LABSUPPORT_NO_BF16 is set to anything but "", "0" or "false".
    Notebook 00 (where the time goes): the switch `bf16_supported` reads on a CPU."""
    return os.environ.get(NO_BF16_SWITCH, "").strip().lower() not in ("", "0", "false", "no")


def bf16_supported(device) -> bool:
    """True when the hardware itself computes in bfloat16 (not just PyTorch emulating it).

    Introduced in notebook 00 (where the time goes). On CUDA this needs an
    Ampere-or-newer GPU, compute capability 8.0+ (a T4 is 7.5: no). On the
    CPU it needs the AVX512-BF16 or AMX instructions (and LABSUPPORT_NO_BF16
    unset). On an Apple GPU it is true when PyTorch can create a bfloat16 tensor there.
    """
    device = pick_device(device)
    if device.type == "cuda":
        # torch.cuda.get_device_capability(device=None) -> (major, minor). bf16 tensor-core math
        # starts with Ampere (8.0); torch.cuda.is_bf16_supported() would also say True on older
        # GPUs, where bf16 is emulated (its including_emulation=True default), so it is not used.
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError):
            return False
        return True
    if cpu_bf16_switched_off():
        return False
    return _cpu_feature("_is_avx512_bf16_supported") or _cpu_feature("_is_amx_tile_supported")


def bf16_emulated(device) -> bool:
    """True where bfloat16 runs correctly but without hardware for it: a CPU without
    AVX512-BF16 or AMX, where PyTorch converts each value to float32 and back.

    Introduced in notebook 03 (mixed precision). Memory and numerics are exactly those
    of bfloat16 hardware (the same bits are stored and rounded); only the speed differs,
    so the course still measures it there and labels it "emulated".
    """
    device = pick_device(device)
    return device.type == "cpu" and not bf16_supported(device)


def dtype_label(device, dtype) -> str:
    """ "bfloat16" or "bfloat16 (emulated)" etc.: a dtype's name as plots and tables show it here.
    Introduced in notebook 03 (mixed precision)."""
    name = dtype_name(dtype)
    slow = (name == "bfloat16" and bf16_emulated(device)) or (
        name == "float16" and pick_device(device).type == "cpu" and not fp16_fast(device))
    return f"{name} (emulated)" if slow else name


def fp16_fast(device) -> bool:
    """True when float16 matrix multiplication runs at full hardware speed.

    Introduced in notebook 00 (where the time goes). A CUDA GPU has fast float16
    from compute capability 7.0 (Volta, tensor cores), and on the P100 (6.0) and
    Jetsons (5.3, 6.2); consumer Pascal cards (6.1, the GTX 10xx) run it at 1/64 of
    their float32 rate. A CPU has it only with AMX-FP16 (recent Intel Xeons).
    Elsewhere float16 works but is converted on the fly and is slow.
    """
    device = pick_device(device)
    if device.type == "cuda":
        capability = tuple(torch.cuda.get_device_capability(device))
        return capability >= (7, 0) or capability in ((5, 3), (6, 0), (6, 2))
    if device.type == "cpu":
        return _cpu_feature("_is_amx_fp16_supported")
    return False


DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
                 "bf16": "bfloat16"}


def bytes_per_value(dtype) -> int:
    """4 for torch.float32 (or "float32", "fp32"), 2 for bfloat16 / float16; an int passes through.
    Notebook 00 (where the time goes)."""
    if isinstance(dtype, int):
        return dtype
    return as_dtype(dtype).itemsize


def as_dtype(dtype) -> torch.dtype:
    """The one dtype parser: torch.bfloat16, "bfloat16", "torch.bfloat16" or "bf16" -> torch.bfloat16.

    Introduced in notebook 00 (where the time goes). Short names: fp32, fp16, half, bf16.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    candidate = getattr(torch, DTYPE_ALIASES.get(name, name), None)
    if isinstance(candidate, torch.dtype):
        return candidate
    raise UnsupportedDtype(f"Unknown precision {dtype!r}; use torch.float32, torch.float16 or torch.bfloat16 "
                           f"(or their names, or fp32, fp16, bf16).")


def dtype_name(dtype) -> str:
    """The short name used as a key in profiles and tables: torch.bfloat16 -> "bfloat16".
    Introduced in notebook 00 (where the time goes)."""
    return str(as_dtype(dtype)).removeprefix("torch.")


def require_usable_dtype(device, dtype) -> None:
    """Raise `UnsupportedDtype` (one sentence, with the fix) if the device cannot run `dtype`.

    Introduced in notebook 00 (where the time goes). Only float32, float16
    and bfloat16 are model dtypes. bfloat16 is refused on a pre-Ampere GPU
    (use its fast float16 instead). On a CPU every model dtype is allowed:
    without bfloat16 or fp16 instructions PyTorch emulates them, with the same
    memory and numerics and a lower speed (`bf16_emulated`, `dtype_label`).
    """
    device = pick_device(device)
    dtype = as_dtype(dtype)
    if dtype not in MODEL_DTYPES:
        raise UnsupportedDtype(
            f"{dtype_name(dtype)} cannot be a model dtype; use torch.float32, torch.float16 or torch.bfloat16."
        )
    if dtype != torch.bfloat16 or bf16_supported(device) or device.type == "cpu":
        return
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        raise UnsupportedDtype(
            f"The {device_name(device)} GPU (compute capability {major}.{minor}) has no bfloat16 support, "
            f"which needs 8.0 or newer; use dtype=torch.float16 or torch.float32."
        )
    raise UnsupportedDtype(
        "This Mac's GPU cannot run bfloat16 with the installed PyTorch; use dtype=torch.float16 or torch.float32."
    )


def pick_dtype(device) -> torch.dtype:
    """The dtype to load models in: bfloat16 where the hardware has it, else float16 on CUDA, else float32.

    Introduced in notebook 00 (where the time goes).
    """
    device = pick_device(device)
    if bf16_supported(device):
        return torch.bfloat16
    if device.type == "cuda":
        return torch.float16
    return torch.float32
