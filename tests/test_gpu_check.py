"""The GPU check (scripts/gpu_check.py) must run unattended on the lent GPU machine, which has
torch, transformers, numpy, safetensors and pytest but none of the course's notebook or serving
packages. Here its CPU rehearsal runs in a fresh interpreter in which those packages cannot be
imported, and the JSON it writes is read back: every item ran (none errored, none timed out),
and a rehearsal says that its figures do not count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# on the GPU machine none of these import (/work/.library/device/KINDS.md lists what it has)
ABSENT_THERE = ("plotly", "ipywidgets", "anywidget", "nbval", "nbformat", "nbgrader", "gguf", "bitsandbytes",
                "fastapi", "uvicorn", "openai", "llama_cpp", "playwright")

BLOCKER = f"""
import importlib.abc, runpy, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {ABSENT_THERE!r}:
            raise ImportError(f"{{name}} is not installed on the GPU machine")
        return None
sys.meta_path.insert(0, Absent())
sys.argv = ["gpu_check.py"] + sys.argv[1:]
runpy.run_path({str(ROOT / "scripts" / "gpu_check.py")!r}, run_name="__main__")
"""


def _check(tmp_path, *args, timeout=900):
    done = subprocess.run([sys.executable, "-c", BLOCKER, "--out", str(tmp_path), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)
    report_path = tmp_path / "gpu-check.json"
    assert report_path.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    return done, json.loads(report_path.read_text())


def _items():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_items
        return gpu_items.ITEMS
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def _assert_ran(record):
    assert record["status"] in ("ok", "skipped"), (record["item"], record.get("reason"), record.get("traceback"))
    assert record["ok"], (record["item"], record.get("result"))
    if record["status"] == "ok":
        assert record["result"]["headline"], record["item"]


@pytest.mark.slow
def test_the_rehearsal_runs_every_item_without_the_notebook_packages(tmp_path):
    done, report = _check(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert report["rehearsal"] is True and report["machine"]["gpu"] is False
    assert [r["item"] for r in report["items"]] == [i.name for i in _items()]
    for record in report["items"]:
        _assert_ran(record)
    by_name = {r["item"]: r for r in report["items"]}
    compiled = by_name["compiled_decode"]["result"]
    assert {r["path"] for r in compiled["rows"]} == {"compiled"}           # a CPU compiles, without graphs
    assert all(r["same_tokens"] for r in compiled["rows"])
    assert [r["compiles"] > 0 for r in compiled["rows"]] == [True, False, True, False]   # one per bucket
    assert "no GPU found" in done.stdout and "gates passed: 3/3" in done.stdout


def test_a_short_rehearsal_writes_its_json_item_by_item(tmp_path):
    done, report = _check(tmp_path, "--only", "runtime", "bandwidth", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["item"] for r in report["items"]] == ["runtime", "bandwidth"]
    for record in report["items"]:
        _assert_ran(record)
    assert report["items"][1]["result"]["bandwidth_bytes_per_s"] > 0


def test_an_item_past_the_budget_is_skipped_and_said(tmp_path):
    done, report = _check(tmp_path, "--only", "runtime", "compiled_decode", "--budget", "5", timeout=300)
    compiled = report["items"][1]
    assert compiled["status"] == "skipped" and not compiled["ok"]          # a gate skipped is a gate failed
    assert "no time left" in compiled["reason"]
    assert done.returncode == 1


def test_no_gpu_is_an_error_when_one_is_required(tmp_path):
    done, report = _check(tmp_path, "--require-gpu", timeout=120)
    assert done.returncode == 3
    assert "A CUDA GPU was expected" in done.stdout
    assert report["error"] == "no GPU"
