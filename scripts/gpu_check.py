"""`make gpu-check`: the course's fast paths on a GPU, gated and then measured, in one unattended run.

A GPU is lent to this course's developers only now and then, for minutes, on a machine with
no network and its own Python (an H200 with torch 2.11, transformers 5.17, numpy, safetensors
and pytest; no plotly, ipywidgets, nbval, nbformat, gguf, bitsandbytes or vLLM). So this
script needs only torch and what labsupport's engine needs, installs nothing, uses random
weights at the real shapes (the embedded model cannot travel), caps every item's time, and
saves its JSON after every item: a run stopped at any point still says what it saw.

First the gates, which must all pass for any figure to count (a fast path that silently
fell back is a failed measurement, not a slow one):

* the machine, and the SDPA backend each attention shape gets;
* compiled decoding: its tokens equal the eager tokens, the step replays as a CUDA graph
  (zero cudagraph skips), and a sweep of shapes stays inside the shape buckets (no
  recompile past the limit);
* the int4 and int8 kernels: the fast ones are chosen, with their error against the
  dequantized weights.

Then the measurements, side by side in the same process:

* the copy bandwidth, timed with CUDA events on >= 4 GiB;
* decode at batch 1, eager against compiled with CUDA graphs, on the 135M and 1.7B shapes
  (tokens/s, the fraction of the copy bandwidth and of the data sheet's HBM bandwidth: an H100
  SXM's 3.35 TB/s, an H200's 4.8 TB/s; any other GPU is said to have no data sheet figure here),
  and the 1.7B shape's step replayed from one torch.cuda.CUDAGraph beside cudagraph trees' row,
  to tell an upstream slowdown of the trees (pytorch#174575) from ours (skipped in a rehearsal);
* int4 and int8 against 16-bit on the 1.7B shape, every row on the same (compiled) path;
* the batching knee (decode steps replayed as CUDA graphs) against the predicted ridge;
* continuous against static batching in the serving engine, ok only where every engine's
  decode steps replay CUDA graphs and, in fp32, give the eager engine's tokens;
* vLLM, only where it imports.

Every item runs with cuDNN attention off (see `gpu_items.cudnn_attention`) and under its cap:
past it, an alarm raises `ItemTimeout` (again every few seconds if the item catches it), the
compile state is reset, and the item's record keeps the rows it finished.

Without a GPU it rehearses: every item runs on the CPU with the tiny model (or says why it
cannot), so the code paths, the start-up and the JSON are checked; CI runs that. With
``--require-gpu`` a missing GPU is an error (exit 3), for the machine where one is expected.

Triton (torch.compile's GPU code) builds a launcher with a C compiler and Python.h, and so do
the rehearsal's C++ kernels: `gpu_items.machine` records both, and where either is missing the
check stops at once, before any item (exit 4), rather than failing every compiled item.

    python scripts/gpu_check.py [--out DIR] [--budget SECONDS] [--require-gpu] [--only ITEM ...]

Exit status: 0 when every gate passed and no item failed, 1 otherwise, 3 for a missing GPU,
4 for a missing C compiler or Python.h.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()                    # the budget counts from here, torch's import included

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                 # labsupport from this tree, installed or not
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_items  # noqa: E402  (after the path is set)

# Seconds for the whole run, from the process's start: 7 minutes, inside the lent machine's
# 10-minute command, leaving 3 for what a cap cannot stop (a signal is handled only between
# two Python bytecodes, so a long call into C++ or a CUDA sync finishes first) and the exit.
DEFAULT_BUDGET = 420
NO_GPU, NO_BUILD_TOOLS = 3, 4                 # exits: a GPU required and missing; no C compiler or Python.h
STARTUP_ALLOWANCE = 30                        # torch's import and CUDA's start: the test of the caps counts it
GRACE_S = 5.0                                 # after a cap, the alarm fires again every GRACE_S seconds


class ItemTimeout(BaseException):
    """An item ran past its cap (raised by the alarm, between two Python bytecodes). A
    BaseException, like KeyboardInterrupt, so that library code's ``except Exception`` (the
    compiled decoder's warm-up falls back to eager on any Exception) cannot swallow it."""


class Alarm:
    """Raise ItemTimeout `cap` seconds after entering, and again every `grace` seconds until
    the block is left: code that catches the first one and carries on is stopped by the next.
    signal.setitimer(ITIMER_REAL, first, interval) is the re-arming timer (SIGALRM, Unix)."""

    def __init__(self, cap: float, grace: float = GRACE_S):
        self.cap, self.grace, self.armed, self.fired = max(cap, 0.001), grace, False, 0

    def _ring(self, signum, frame):
        if self.armed:                                # a signal already on its way after disarm(): ignored
            self.fired += 1
            raise ItemTimeout()

    def __enter__(self) -> "Alarm":
        self.previous = signal.signal(signal.SIGALRM, self._ring)
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, self.cap, self.grace)
        return self

    def disarm(self) -> None:
        """Stop the timer (twice is harmless: run_item calls it again if the alarm rang in here)."""
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous or signal.SIG_DFL)

    def __exit__(self, *exc) -> None:
        self.disarm()


def reset_after_timeout(ctx: gpu_items.Context) -> str:
    """Forget the compile state an item stopped midway may have left half-built: Dynamo's caches
    (torch._dynamo.reset(), torch/_dynamo/__init__.py; in torch 2.11 it also resets the CUDA
    graph trees where CUDA is available), the CUDA graph trees themselves where torch has them
    (torch/_inductor/cudagraph_trees.py: reset_cudagraph_trees), and the models built so far
    (the next item builds its own). Returns what was done, for the record."""
    import torch
    done = []
    try:
        torch._dynamo.reset()
        done.append("torch._dynamo.reset()")
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        except ImportError:
            reset_cudagraph_trees = None
        if reset_cudagraph_trees is not None:
            reset_cudagraph_trees()
            done.append("reset_cudagraph_trees()")
        ctx.free()
        done.append("models freed")
    except Exception as error:                         # noqa: BLE001 - said in the record, the run goes on
        done.append(f"reset failed: {type(error).__name__}: {error}"[:300])
    return "; ".join(done)


def run_item(item: gpu_items.Item, ctx: gpu_items.Context, cap: float, grace: float = GRACE_S) -> dict:
    """Run one item under its time cap, with cuDNN attention off; its result, status, seconds
    and the rows it finished (``rows``, filled as it goes, kept when it is stopped), never an
    exception."""
    start = time.perf_counter()
    record = {"item": item.name, "kind": item.kind, "cap_s": round(cap, 1)}
    if cap < item.minimum_s:
        return {**record, "status": "skipped", "ok": item.kind != "gate",
                "reason": f"no time left in the budget ({cap:.0f} s left, needs {item.minimum_s:.0f})"}
    ctx.rows = record["rows"] = {}                     # the same dict: rows land in the record as measured
    alarm = Alarm(cap, grace)
    try:
        with gpu_items.cudnn_attention(False), alarm:
            result = item.run(ctx)
        if alarm.fired:                                # the item caught ItemTimeout and returned anyway
            raise ItemTimeout()
        status = result.pop("status", "ok")
        ok = result.pop("ok", True)
        record.update(status=status, ok=bool(ok), result=result)
    except ItemTimeout:
        alarm.disarm()                                 # it may have rung again inside __exit__
        record.update(status="timeout", ok=False,
                      reason=f"stopped after its cap of {cap:.0f} s, {len(record['rows'])} row(s) finished",
                      reset=reset_after_timeout(ctx))
    except Exception as error:                         # noqa: BLE001 - every failure is reported, the run goes on
        record.update(status="error", ok=False, reason=f"{type(error).__name__}: {error}".splitlines()[0][:300],
                      traceback=traceback.format_exc()[-3000:])
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def summary(report: dict) -> str:
    """One screen: the machine, then one line per item with its headline."""
    m = report["machine"]
    head = (f"GPU: {m.get('name')} (capability {m.get('capability')}, {m.get('memory_gib')} GiB), torch "
            f"{m['torch']}, CUDA {m['cuda']}" if m["gpu"] else
            f"no GPU found (torch {m['torch']}): a rehearsal on the CPU, no figure counts")
    lines = [head, ""]
    for record in report["items"]:
        status = "ok" if record["ok"] and record["status"] == "ok" else record["status"].upper()
        if not record["ok"]:
            status = f"FAILED ({record['status']})"
        headline = record.get("result", {}).get("headline") or record.get("reason", "")
        lines.append(f"{status:>18} {record.get('seconds', 0):6.1f} s  {record['kind']:>7}  {record['item']}: {headline}")
    gates = [r for r in report["items"] if r["kind"] == "gate"]
    lines += ["", f"gates passed: {sum(r['ok'] for r in gates)}/{len(gates)}; items ok: "
                  f"{sum(r['ok'] for r in report['items'])}/{len(report['items'])}; {report['seconds']:.0f} s; "
                  f"details in {report['json']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Gate and measure the course's GPU fast paths in one run "
                                                 "(a CPU rehearsal without a GPU).")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "gpu-check"),
                        help="directory for gpu-check.json (default: $OUT, else reports/gpu-check)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET})")
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit 3 if no CUDA GPU is found (for the machine where one is expected)")
    parser.add_argument("--only", nargs="+", metavar="ITEM", choices=[i.name for i in gpu_items.ITEMS],
                        help="run only these items (default: all)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "gpu-check.json"
    machine = gpu_items.machine()
    if args.require_gpu and not machine["gpu"]:
        print(f"A CUDA GPU was expected and none was found (torch {machine['torch']}, CUDA build "
              f"{machine['cuda']}); run this on the GPU machine, or drop --require-gpu for a CPU rehearsal.")
        json_path.write_text(json.dumps({"machine": machine, "error": "no GPU"}, indent=1))
        return NO_GPU
    missing = gpu_items.missing_build_tools(machine)
    if missing:
        print(f"This machine lacks {' and '.join(missing)}, which Triton needs to build torch.compile's kernels "
              f"(and a rehearsal its C++ kernels); install them (or set CC) and run the check again.")
        json_path.write_text(json.dumps({"machine": machine, "error": "missing build tools", "missing": missing},
                                        indent=1))
        return NO_BUILD_TOOLS
    ctx = gpu_items.Context.for_machine(machine)
    report = {"machine": machine, "budget_s": args.budget, "rehearsal": not machine["gpu"],
              "startup_s": round(time.monotonic() - STARTED, 1), "cudnn_attention": "off in every item "
              "(sdpa_backends profiles one shape with it on too)", "json": str(json_path), "items": []}
    # a rehearsal runs the int4 layers and the CPU decode through our C++ kernels: build them now,
    # before the first item and outside every cap and the budget (37-44 s cold on 2 cores)
    builds = {} if machine["gpu"] else gpu_items.build_cpu_kernels()
    report["cpu_kernels"] = builds
    deadline = STARTED + args.budget + builds.get("seconds", 0.0)
    items = [i for i in gpu_items.ITEMS if not args.only or i.name in args.only]
    for index, item in enumerate(items):
        left = deadline - time.monotonic()
        # each item may take its own cap, but never the time the items after it need at least
        reserve = sum(i.minimum_s for i in items[index + 1:])
        cap = min(item.cap_s if machine["gpu"] else item.rehearsal_cap_s, left - reserve)
        record = run_item(item, ctx, cap)
        report["items"].append(record)
        report["seconds"] = round(time.monotonic() - STARTED, 1)
        json_path.write_text(json.dumps(report, indent=1, default=str))        # after every item
        print(f"[gpu-check] {record['item']}: {record['status']} in {record.get('seconds', 0)} s", flush=True)
    report["seconds"] = round(time.monotonic() - STARTED, 1)
    json_path.write_text(json.dumps(report, indent=1, default=str))
    print(summary(report))
    return 0 if all(r["ok"] for r in report["items"]) else 1


if __name__ == "__main__":
    sys.exit(main())
