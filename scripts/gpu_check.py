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
  (tokens/s and the fraction of the copy bandwidth);
* int4 and int8 against 16-bit on the 1.7B shape, every row on the same (compiled) path;
* the batching knee (decode steps replayed as CUDA graphs) against the predicted ridge;
* continuous against static batching in the serving engine;
* vLLM, only where it imports.

Without a GPU it rehearses: every item runs on the CPU with the tiny model (or says why it
cannot), so the code paths, the start-up and the JSON are checked; CI runs that. With
``--require-gpu`` a missing GPU is an error (exit 3), for the machine where one is expected.

    python scripts/gpu_check.py [--out DIR] [--budget SECONDS] [--require-gpu] [--only ITEM ...]

Exit status: 0 when every gate passed and no item failed, 1 otherwise, 3 for a missing GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                 # labsupport from this tree, installed or not
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_items  # noqa: E402  (after the path is set)

DEFAULT_BUDGET = 480                          # seconds: 8 minutes, inside a 10-minute command


class ItemTimeout(Exception):
    """An item ran past its cap (raised by the alarm, between two Python bytecodes)."""


def _alarm(signum, frame):
    raise ItemTimeout()


def run_item(item: gpu_items.Item, ctx: gpu_items.Context, cap: float) -> dict:
    """Run one item under its time cap; its result, status and seconds, never an exception."""
    start = time.perf_counter()
    record = {"item": item.name, "kind": item.kind, "cap_s": round(cap)}
    if cap < item.minimum_s:
        return {**record, "status": "skipped", "ok": item.kind != "gate",
                "reason": f"no time left in the budget ({cap:.0f} s left, needs {item.minimum_s:.0f})"}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(cap)))
    try:
        result = item.run(ctx)
        status = result.pop("status", "ok")
        ok = result.pop("ok", True)
        record.update(status=status, ok=bool(ok), result=result)
    except ItemTimeout:
        record.update(status="timeout", ok=False, reason=f"stopped after its cap of {cap:.0f} s")
    except Exception as error:                 # noqa: BLE001 - every failure is reported, the run goes on
        record.update(status="error", ok=False, reason=f"{type(error).__name__}: {error}".splitlines()[0][:300],
                      traceback=traceback.format_exc()[-3000:])
    finally:
        signal.alarm(0)
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
    start = time.time()
    machine = gpu_items.machine()
    if args.require_gpu and not machine["gpu"]:
        print(f"A CUDA GPU was expected and none was found (torch {machine['torch']}, CUDA build "
              f"{machine['cuda']}); run this on the GPU machine, or drop --require-gpu for a CPU rehearsal.")
        json_path.write_text(json.dumps({"machine": machine, "error": "no GPU"}, indent=1))
        return 3
    ctx = gpu_items.Context.for_machine(machine)
    report = {"machine": machine, "budget_s": args.budget, "rehearsal": not machine["gpu"],
              "json": str(json_path), "items": []}
    items = [i for i in gpu_items.ITEMS if not args.only or i.name in args.only]
    for index, item in enumerate(items):
        left = start + args.budget - time.time()
        # each item may take its own cap, but never the time the items after it need at least
        reserve = sum(i.minimum_s for i in items[index + 1:])
        cap = min(item.cap_s if machine["gpu"] else item.rehearsal_cap_s, left - reserve)
        record = run_item(item, ctx, cap)
        report["items"].append(record)
        report["seconds"] = round(time.time() - start, 1)
        json_path.write_text(json.dumps(report, indent=1, default=str))        # after every item
        print(f"[gpu-check] {record['item']}: {record['status']} in {record.get('seconds', 0)} s", flush=True)
    report["seconds"] = round(time.time() - start, 1)
    json_path.write_text(json.dumps(report, indent=1, default=str))
    print(summary(report))
    return 0 if all(r["ok"] for r in report["items"]) else 1


if __name__ == "__main__":
    sys.exit(main())
