"""`make gpu-notebooks`: the whole course on a GPU (Colab's T4, say): the `gpu`-marked tests,
every notebook under nbval and a short tour, in one longer run (20-40 minutes on a T4).

The short, unattended check of the fast paths is `make gpu-check` (scripts/gpu_check.py);
this one runs what a learner runs, so it needs the whole `test` extra (nbval, plotly,
ipywidgets) and the embedded model. Its steps:

1. the machine: torch, CUDA, the GPU's name, compute capability and memory, and what
   labsupport chooses there (`delivery.describe_runtime`);
2. the `gpu`-marked tests (tests/test_gpu.py and the others so marked);
3. every notebook under nbval, each with its share of the time left;
4. a short GPU tour (`python -m labsupport tour` with few tokens and repeats).

It writes `gpu-notebooks.json` (every step: command, exit status, seconds, the end of its
output) and prints a one-screen summary. Without a GPU it is a dry run: it checks that
each step's command starts (pytest collects, the tour's CLI answers) and says that no
GPU was found; CI runs that dry run.

    python scripts/gpu_notebooks.py [--out DIR] [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
TAIL = 4000                           # characters of each step's output kept in the JSON


def machine() -> dict:
    """What torch sees, and what labsupport chooses on it."""
    import torch

    from labsupport.delivery import describe_runtime
    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.is_available(), "runtime": describe_runtime()}
    if info["gpu"]:
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2**30, 1), count=torch.cuda.device_count())
    return info


def run_step(name: str, command: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run one step with a time limit; its exit status, seconds and the end of its output."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1),
                              env={**os.environ, **(env or {})})
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        rc = "timeout"
        output = ((stopped.stdout or b"").decode(errors="replace") if isinstance(stopped.stdout, bytes)
                  else stopped.stdout or "") + f"\n[gpu-check] stopped after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    return {"step": name, "command": " ".join(command), "rc": rc, "seconds": round(seconds, 1),
            "ok": rc == 0, "output_tail": output[-TAIL:]}


def gpu_steps(out: Path, deadline: float) -> list[dict]:
    """The checks on a GPU, each given its share of the time left before `deadline`."""
    python = sys.executable
    steps = [run_step("gpu-marked tests", [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                           "tests"], timeout=min(150, deadline - time.time()))]
    tour_reserve = 120
    for index, path in enumerate(NOTEBOOKS):
        left = deadline - time.time() - tour_reserve
        share = left / (len(NOTEBOOKS) - index)
        if share < 15:
            steps.append({"step": f"nbval {path.name}", "rc": "skipped", "ok": False, "seconds": 0,
                          "output_tail": "no time left in the budget"})
            continue
        steps.append(run_step(f"nbval {path.name}", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                     str(path.relative_to(ROOT))], timeout=share))
    steps.append(run_step("short GPU tour", [python, "-m", "labsupport", "tour", "--device", "cuda",
                                            "--new-tokens", "16", "--repeats", "2", "--kv-lengths", "64", "256",
                                            "--out", str(out / "tour")],
                          timeout=max(deadline - time.time(), 30)))
    return steps


def dry_steps() -> list[dict]:
    """Without a GPU: each step's command starts (collection only, the CLI's help)."""
    python = sys.executable
    return [
        run_step("gpu-marked tests (collected only)",
                 [python, "-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider", "tests"], 120),
        run_step("notebooks (collected only)",
                 [python, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                  *[str(p.relative_to(ROOT)) for p in NOTEBOOKS]], 120),
        run_step("tour CLI", [python, "-m", "labsupport", "tour", "--help"], 60),
    ]


def summary(report: dict) -> str:
    """One screen: the machine, then one line per step."""
    m = report["machine"]
    head = (f"GPU: {m.get('name')} (capability {m.get('capability')}, {m.get('memory_gib')} GiB), "
            f"torch {m['torch']}, CUDA {m['cuda']}" if m["gpu"] else
            f"no GPU found (torch {m['torch']}): dry run, each step only started")
    lines = [head, m["runtime"], ""]
    for step in report["steps"]:
        status = "ok" if step["ok"] else f"FAILED ({step['rc']})"
        lines.append(f"{status:>16}  {step['seconds']:6.1f} s  {step['step']}")
    lines += ["", f"{sum(s['ok'] for s in report['steps'])}/{len(report['steps'])} steps ok in "
                  f"{report['seconds']:.0f} s; details in {report['json']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole course on a GPU (dry run without one).")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "gpu-notebooks"),
                        help="directory for gpu-notebooks.json (default: $OUT, else reports/gpu-notebooks)")
    parser.add_argument("--budget", type=float, default=2400, help="seconds for the whole run (default 2400)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    report = {"machine": machine(), "budget_s": args.budget}
    report["dry_run"] = not report["machine"]["gpu"]
    report["steps"] = dry_steps() if report["dry_run"] else gpu_steps(out, start + args.budget)
    report["seconds"] = round(time.time() - start, 1)
    report["json"] = str(out / "gpu-notebooks.json")
    Path(report["json"]).write_text(json.dumps(report, indent=1))
    print(summary(report))
    return 0 if all(step["ok"] for step in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
