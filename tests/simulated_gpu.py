"""Stand-in GPUs for CPU-only tests: torch.cuda's queries patched to answer as a T4, an A100 or an H100.

Only the questions labsupport asks before it puts anything on a GPU are answered
(is there one, how many, its name, compute capability and memory); no tensor can be
created on "cuda" here. So these tests check the decisions (dtypes offered, kernels,
sizes, what is printed), never a CUDA kernel: that is `make gpu-check`'s job on a real GPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

import torch


@dataclass(frozen=True)
class SimulatedGPU:
    """What torch.cuda reports for one GPU model."""
    name: str
    capability: tuple[int, int]
    memory_gib: float

    @property
    def total_memory(self) -> int:
        return int(self.memory_gib * 2**30)


GPUS = {
    "T4": SimulatedGPU("Tesla T4", (7, 5), 15.0),                       # Colab's free GPU: no bf16, no tinygemm
    "A100": SimulatedGPU("NVIDIA A100-SXM4-40GB", (8, 0), 40.0),
    "H100": SimulatedGPU("NVIDIA H100 80GB HBM3", (9, 0), 80.0),
}


class HostClockEvent:
    """A stand-in `torch.cuda.Event(enable_timing=True)`: records the host clock (no GPU here)."""

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None):
        import time
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end: "HostClockEvent") -> float:
        return (end.at - self.at) * 1e3                # milliseconds, as torch answers


@contextmanager
def simulated(gpu: SimulatedGPU):
    """Within the block, torch.cuda answers as if `gpu` were the one visible GPU."""
    props = SimpleNamespace(name=gpu.name, major=gpu.capability[0], minor=gpu.capability[1],
                            total_memory=gpu.total_memory, multi_processor_count=40)
    with mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=1), \
            mock.patch.object(torch.cuda, "get_device_name", return_value=gpu.name), \
            mock.patch.object(torch.cuda, "get_device_capability", return_value=gpu.capability), \
            mock.patch.object(torch.cuda, "get_device_properties", return_value=props), \
            mock.patch.object(torch.cuda, "mem_get_info", return_value=(gpu.total_memory, gpu.total_memory)), \
            mock.patch.object(torch.cuda, "is_bf16_supported", return_value=gpu.capability >= (8, 0)), \
            mock.patch.object(torch.cuda, "synchronize", return_value=None), \
            mock.patch.object(torch.cuda, "Event", HostClockEvent):
        yield gpu
