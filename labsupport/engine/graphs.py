"""Capturing a pass as a CUDA graph, and replaying it: the one home of that recipe.

Introduced in notebook 00 (where the time goes).

On a GPU a small model's decode step is several hundred kernels, and launching each one
from Python costs more than the GPU takes to run it: an eager step measures the launches,
not the memory. A CUDA graph records the kernels once; `replay()` then launches them all
in one call. torch's recipe (`torch.cuda.graph`): run the pass a few times on a side stream
(so that lazy initialization and the allocator settle), capture it once, replay it.

A captured pass reads and writes the same tensors at every replay: its inputs must be
static buffers that the caller fills in place before each replay, and it must never wait
for the host (no `.item()`, no `int(tensor)`). What it returned at capture is its output
at every replay, overwritten by the next one. The serving engine's decode graphs
(`serving/decode_graphs.py`), the compiled decoder's CUDA graphs (`compiled.py`, through
torch.compile's cudagraph trees) and every timed step in `labsupport.lab` rest on this.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import LabError, first_line

WARMUP_RUNS = 3          # eager runs on the side stream before the capture, as torch's docs do


class CaptureFailed(LabError):
    """A pass could not be captured as a CUDA graph: its message is the reason, one clause
    without a final period, for the caller to finish (a failed measurement, or an eager
    fallback that is said). Notebook 00 (where the time goes)."""


def capture(fn: Callable[[], object], device, what: str, pool=None) -> Callable[[], object]:
    """`fn` captured once as a CUDA graph on `device`; returns a zero-argument function that
    replays it and returns what `fn` returned at capture (overwritten by each replay).
    pool: a `torch.cuda.graph_pool_handle()` to share memory with other graphs replayed one
    after another. `fn` must leave the host's state as it found it (the warm-up runs it
    several times). Raises `CaptureFailed` naming `what`. Notebook 00 (where the time goes)."""
    device = torch.device(device)
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    except Exception as error:               # noqa: BLE001 - said by the caller, never silently eager
        raise CaptureFailed(f"{what} could not be captured as a CUDA graph "
                            f"({first_line(error, with_type=True)})") from None

    def replay():
        graph.replay()
        return out
    replay.graph = graph                     # the graph lives as long as its replay function
    return replay
