"""The GPU check (scripts/gpu_check.py) must run unattended on the lent GPU machine, which has
torch, transformers, numpy, safetensors and pytest but none of the course's notebook or serving
packages. Here its CPU rehearsal runs in a fresh interpreter in which those packages cannot be
imported, and the JSON it writes is read back: every item ran (none errored, none timed out),
and a rehearsal says that its figures do not count."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

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


@pytest.fixture(scope="module")
def gpu_check():
    """scripts/gpu_check.py as a module (it puts the tree and scripts/ on sys.path; undone after)."""
    before = list(sys.path)
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path[:] = before


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
    compiled = list(by_name["compiled_decode"]["rows"].values())
    assert {r["path"] for r in compiled} == {"compiled"}                    # a CPU compiles, without graphs
    assert all(r["same_tokens"] for r in compiled)
    assert [r["compiles"] > 0 for r in compiled] == [True, False, True, False]   # one per bucket
    sdpa = by_name["sdpa_backends"]["rows"]
    assert {r["backend"] for r in sdpa.values()} == {"flash (cpu)"} and len(sdpa) == 5
    assert [r["cudnn_enabled"] for r in sdpa.values()] == [False] * 4 + [True]
    manual = by_name["decode_bs1"]["rows"].pop("large (tiny-llama) torch.cuda.CUDAGraph step")
    assert manual["status"] == "skipped" and "runs on the CPU" in manual["reason"]      # no CUDA graph on a CPU
    for item in ("decode_bs1", "quant_decode"):                             # compiled rows: the path, apart
        for label, row in by_name[item]["rows"].items():
            assert row["ok"], (label, row["note"])
            assert {"path", "compiles", "cudagraph_skips", "warmup_s", "timed_s"} <= set(row)
            if "eager" not in label:
                assert row["path"] == "compiled" and row["timed_compiles"] == 0
    knee = by_name["batching_knee"]
    assert knee["result"]["context"] == 16 and len(knee["rows"]) == 3
    assert all(r["roofline_s"] > 0 and r["measured_over_roofline"] > 0 for r in knee["rows"].values())
    assert "no GPU found" in done.stdout and "gates passed: 3/3" in done.stdout


def test_a_short_rehearsal_writes_its_json_item_by_item(tmp_path):
    done, report = _check(tmp_path, "--only", "runtime", "bandwidth", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["item"] for r in report["items"]] == ["runtime", "bandwidth"]
    for record in report["items"]:
        _assert_ran(record)
    assert report["items"][1]["rows"]["copy"]["bandwidth_bytes_per_s"] > 0


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


# --- the pieces, in this process ----------------------------------------------------------

@pytest.mark.parametrize("ops, backend", [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
      "aten::_flash_attention_forward"], "flash"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_efficient_attention",
      "aten::_efficient_attention_forward"], "memory-efficient"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_cudnn_attention"], "cudnn"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"], "flash (cpu)"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math"], "math"),
    (["aten::_flash_attention_forward"], "flash"),
    (["aten::scaled_dot_product_attention"], "unknown"),
    ([], "unknown"),
])
def test_the_sdpa_backend_comes_from_the_op_that_ran(gpu_check, ops, backend):
    assert gpu_check.gpu_items.sdpa_backend(ops) == backend


def test_the_caps_and_minimums_fit_the_budget(gpu_check):
    items = gpu_check.gpu_items.ITEMS
    assert gpu_check.DEFAULT_BUDGET <= 450                                   # a 10-minute command, with room
    assert sum(i.minimum_s for i in items) + gpu_check.STARTUP_ALLOWANCE < 0.8 * gpu_check.DEFAULT_BUDGET
    for item in items:
        assert 0 < item.minimum_s <= item.cap_s <= gpu_check.DEFAULT_BUDGET, item.name


def _context(gpu_check):
    gpu_items = gpu_check.gpu_items
    return gpu_items.Context.for_machine({"gpu": False})


def _run(gpu_check, run, cap=0.5, grace=0.3):
    item = gpu_check.gpu_items.Item("fake", "measure", run, cap_s=cap, minimum_s=0)
    start = time.monotonic()
    record = gpu_check.run_item(item, _context(gpu_check), cap, grace=grace)
    return record, time.monotonic() - start


def test_an_item_that_swallows_exception_is_still_stopped(gpu_check):
    def swallows(ctx):
        while True:
            try:
                time.sleep(0.01)
            except Exception:                                  # what library code does: ItemTimeout passes
                pass
    record, seconds = _run(gpu_check, swallows)
    assert record["status"] == "timeout" and not record["ok"] and seconds < 10   # the reset imports inductor


def test_the_alarm_rings_again_for_an_item_that_catches_it(gpu_check):
    caught = []

    def catches_once(ctx):
        try:
            while True:
                time.sleep(0.01)
        except BaseException as error:                        # catches even ItemTimeout, once
            caught.append(type(error).__name__)
        while True:
            time.sleep(0.01)
    record, seconds = _run(gpu_check, catches_once)
    assert caught == ["ItemTimeout"] and record["status"] == "timeout" and seconds < 10


def test_an_item_that_returns_after_catching_the_alarm_is_a_timeout(gpu_check):
    def returns(ctx):
        try:
            time.sleep(5)
        except BaseException:
            return {"headline": "finished anyway"}
    record, _ = _run(gpu_check, returns)
    assert record["status"] == "timeout" and not record["ok"]


def test_a_stopped_item_keeps_its_finished_rows_and_dynamo_is_reset(gpu_check):
    import torch
    from torch._dynamo.utils import counters

    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    compiled(torch.ones(3))
    graphs = counters["stats"]["unique_graphs"]

    def two_rows_then_hangs(ctx):
        for batch in (1, 2):
            ctx.rows[f"batch {batch}"] = {"batch": batch, "seconds": 0.1 * batch}
        while True:
            time.sleep(0.01)
    record, _ = _run(gpu_check, two_rows_then_hangs)
    assert record["status"] == "timeout"
    assert record["rows"] == {"batch 1": {"batch": 1, "seconds": 0.1}, "batch 2": {"batch": 2, "seconds": 0.2}}
    assert "torch._dynamo.reset()" in record["reset"] and "2 row(s) finished" in record["reason"]
    compiled(torch.ones(3))                                    # Dynamo forgot it: compiled again
    assert counters["stats"]["unique_graphs"] == graphs + 1


def test_every_item_runs_with_cudnn_attention_off_and_it_is_restored(gpu_check):
    import torch
    seen = []
    before = torch.backends.cuda.cudnn_sdp_enabled()
    record, _ = _run(gpu_check, lambda ctx: seen.append(torch.backends.cuda.cudnn_sdp_enabled()) or {"headline": "x"})
    assert record["status"] == "ok" and seen == [False]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


@pytest.mark.parametrize("gpu, path, skips, ok", [
    (True, "compiled + CUDA graphs", 0, True),
    (True, "compiled", 0, False),                              # compiled without graphs: not the fast path
    (True, "compiled + CUDA graphs", 2, False),
    (False, "compiled", 0, True),                              # the CPU rehearsal's expected path
    (False, "eager", 0, False),
])
def test_a_compiled_row_counts_only_on_the_expected_path(gpu_check, gpu, path, skips, ok):
    ctx = _context(gpu_check)
    ctx.gpu = gpu
    row = {"path": path, "cudagraph_skips": skips, "timed_compiles": 0}
    verdict, note = gpu_check.gpu_items._path_verdict(ctx, row, "torch said why")
    assert verdict is ok and (ok or note)


def test_the_cpu_kernels_build_before_the_first_item_outside_every_cap(gpu_check, monkeypatch, tmp_path):
    """Issue 47: cold, the W4A8 kernel's build (37-44 s on 2 cores) ran inside quant_kernels' 30 s
    cap and timed it out. The build now runs before the first item; a build slower than the
    item's cap leaves the item passing, and the report says what was built and how long it took."""
    import dataclasses
    order = []

    def slow_build():
        order.append("build")
        time.sleep(1.5)
        return {"status": {"fused": None, "w4a8": None}, "seconds": 1.5}

    def item(ctx):
        order.append("item")
        return {"ok": True}

    tiny_cap = dataclasses.replace(gpu_check.gpu_items.ITEMS[0], name="quant_kernels", run=item,
                                   rehearsal_cap_s=1.0, minimum_s=0.1)
    monkeypatch.setattr(gpu_check.gpu_items, "build_cpu_kernels", slow_build)
    monkeypatch.setattr(gpu_check.gpu_items, "ITEMS", [tiny_cap])
    assert gpu_check.main(["--out", str(tmp_path), "--only", "quant_kernels"]) == 0
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert order == ["build", "item"]
    assert report["items"][0]["status"] == "ok" and report["cpu_kernels"]["seconds"] == 1.5


def test_the_real_build_step_loads_both_kernels(gpu_check):
    built = gpu_check.gpu_items.build_cpu_kernels()
    assert built["status"] == {"fused": None, "w4a8": None} and built["seconds"] >= 0


# --- the serving item: ok only on the graphed path, graphed tokens against eager ones in fp32 ----

def test_the_serving_item_says_ok_in_a_rehearsal(gpu_check):
    """Issue 51, item 4: the serving item returned no ``ok``. In a rehearsal (no GPU) the engines
    decode eagerly, as expected there, and nothing is compared against graphs."""
    ctx = _context(gpu_check)
    result = gpu_check.gpu_items.serving(ctx)
    assert result["ok"] is True and result["failures"] == []
    assert {ctx.rows[p]["decode_path"] for p in ("static", "continuous")} == {"eager"}
    assert "fp32_graphed_same_tokens_as_eager" not in ctx.rows


class _FakeEngine:
    """A serving engine that says it ran `path` with `tokens` (those of an eager engine: `eager`)."""
    made: list = []
    path, note, graphed_tokens, eager_tokens = "", None, {}, {}

    def __init__(self, model, max_slots, policy, cuda_graphs=None):
        from types import SimpleNamespace
        self.graphs, self.cuda_graphs = None, cuda_graphs
        self.blocks = SimpleNamespace(assert_no_leaks=lambda: None)
        _FakeEngine.made.append((model.dtype, policy, cuda_graphs))

    def run(self, requests):
        from types import SimpleNamespace
        eager = self.cuda_graphs is False
        tokens = self.eager_tokens if eager else self.graphed_tokens
        return SimpleNamespace(decode_path="eager" if eager else self.path, decode_note=None if eager else self.note,
                               tokens=lambda: dict(tokens))


@pytest.mark.parametrize("path, note, graphed, ok, words", [
    ("CUDA graphs (decode steps)", None, {0: [5, 6], 1: [7]}, True, "fp32 graphed tokens = eager for 2/2"),
    ("eager", "bucket (4, 2) could not be captured", {0: [5, 6], 1: [7]}, False, "could not be captured"),
    ("CUDA graphs (decode steps)", None, {0: [5, 9], 1: [7]}, False, "differ from the eager engine's for 1 of 2"),
])
def test_the_serving_item_fails_when_a_gpu_engine_is_not_graphed_or_its_fp32_tokens_differ(
        gpu_check, monkeypatch, path, note, graphed, ok, words):
    import torch

    import labsupport.engine.serving as serving_package
    import labsupport.lab.serving_metrics as serving_metrics
    ctx = _context(gpu_check)
    ctx.gpu, ctx.half = True, torch.bfloat16                  # decided as on a GPU; the tiny model stays on the CPU
    _FakeEngine.made = []
    monkeypatch.setattr(_FakeEngine, "path", path)
    monkeypatch.setattr(_FakeEngine, "note", note)
    monkeypatch.setattr(_FakeEngine, "graphed_tokens", graphed)
    monkeypatch.setattr(_FakeEngine, "eager_tokens", {0: [5, 6], 1: [7]})
    monkeypatch.setattr(serving_package, "Engine", _FakeEngine)
    monkeypatch.setattr(serving_metrics, "summarize",
                        lambda result: {"throughput_tokens_per_s": 10.0, "ttft_p50": 0.1, "duration": 1.0})
    result = gpu_check.gpu_items.serving(ctx)
    assert result["ok"] is ok and (words in result["headline"])
    assert not ok or result["failures"] == []
    # throughput in 16 bits (graphed by default), the token comparison in fp32, graphed then eager
    assert _FakeEngine.made == [(torch.bfloat16, "static", None), (torch.bfloat16, "continuous", None),
                                (torch.float32, "continuous", None), (torch.float32, "continuous", False)]


# --- Triton's build tools: recorded, and the check stops at once without them ------------------

@pytest.mark.parametrize("missing", ["c_compiler", "python_h"])
def test_the_check_stops_at_once_with_its_own_exit_status_without_a_c_compiler_or_python_h(
        gpu_check, monkeypatch, tmp_path, capsys, missing):
    """Issue 51, item 8: Triton builds a launcher with a C compiler and Python.h; without either,
    every compiled item would fail one by one. `machine()` records both, and the check stops
    before any item (and before the rehearsal's kernel build), with exit status 4."""
    tools = {"c_compiler": "/usr/bin/gcc", "python_h": "/usr/include/python3.11/Python.h", missing: None}
    monkeypatch.setattr(gpu_check.gpu_items, "build_tools", lambda: dict(tools))
    monkeypatch.setattr(gpu_check.gpu_items, "build_cpu_kernels", lambda: pytest.fail("built kernels"))
    monkeypatch.setattr(gpu_check.gpu_items, "ITEMS", [])
    assert gpu_check.main(["--out", str(tmp_path)]) == gpu_check.NO_BUILD_TOOLS == 4
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["error"] == "missing build tools" and report["machine"][missing] is None
    word = "C compiler" if missing == "c_compiler" else "Python.h"
    assert len(report["missing"]) == 1 and word in report["missing"][0]
    out = capsys.readouterr().out
    assert f"This machine lacks {report['missing'][0]}, which Triton needs" in out and "Traceback" not in out
    assert "4 for a missing C compiler or Python.h" in gpu_check.__doc__


def test_the_build_tools_are_found_as_triton_finds_them(gpu_check, monkeypatch, tmp_path):
    import shutil
    import sysconfig
    found = {"gcc": "/usr/bin/gcc", "clang": "/usr/bin/clang", "/opt/cc": "/opt/cc"}
    monkeypatch.setattr(shutil, "which", lambda name: found.get(name) or (name if name in found.values() else None))
    (tmp_path / "Python.h").write_text("")
    monkeypatch.setattr(sysconfig, "get_paths", lambda scheme=None: {"include": str(tmp_path)})
    monkeypatch.delenv("CC", raising=False)
    assert gpu_check.gpu_items.build_tools() == {"c_compiler": "/usr/bin/gcc", "python_h": str(tmp_path / "Python.h")}
    monkeypatch.setenv("CC", "/opt/cc")                                    # $CC first
    assert gpu_check.gpu_items.build_tools()["c_compiler"] == "/opt/cc"
    monkeypatch.delenv("CC")
    del found["gcc"]                                                         # then gcc, then clang
    assert gpu_check.gpu_items.build_tools()["c_compiler"] == "/usr/bin/clang"
    found.clear()
    (tmp_path / "Python.h").unlink()
    tools = gpu_check.gpu_items.build_tools()
    assert tools == {"c_compiler": None, "python_h": None}
    assert len(gpu_check.gpu_items.missing_build_tools(tools)) == 2
    assert set(tools) <= set(gpu_check.gpu_items.machine())                 # recorded with the machine


def _stand_in_generate(model, prompt, n, eos_token_ids, compile):
    """What the decode rows read of a `generate` result: 1000 tokens/s, the rehearsal's paths, nothing compiled."""
    from types import SimpleNamespace
    return SimpleNamespace(decode_tokens_per_s=1000.0, decode_path="compiled" if compile else "eager", compiles=0,
                           cudagraph_skips=0, warmup_seconds=0.0, decode_seconds=0.01, decode_note=None)


# --- the headline: decode bandwidth of the copy probe's and of the data sheet's (issue 51, item 9) ---

@pytest.mark.parametrize("name, sheet", [("NVIDIA H100 80GB HBM3", ("H100 SXM", 3.35e12)),
                                         ("NVIDIA H200", ("H200", 4.8e12)),
                                         ("NVIDIA H100 PCIe", None), ("Tesla T4", None), (None, None)])
def test_the_rehearsals_headlines_give_the_data_sheets_fraction_beside_the_copy_probes(
        gpu_check, monkeypatch, tmp_path, capsys, name, sheet):
    """The bandwidth and decode lines said only the fraction of the copy probe's bandwidth; they say
    the fraction of the data sheet's HBM bandwidth too where the GPU's name has one (an H100 SXM
    3.35 TB/s, an H200 4.8 TB/s), and that there is none for any other GPU. The rehearsal runs with
    the device's name patched (None: the CPU's own), a copy probe of a known speed and a stand-in
    `generate` at 1000 tokens/s."""
    from labsupport.lab import roofs
    from labsupport.lab.measure import Timing
    items = gpu_check.gpu_items
    if name is not None:
        monkeypatch.setattr(items, "device_name", lambda device: name)
    monkeypatch.setattr(items, "build_cpu_kernels", lambda: {})
    monkeypatch.setattr(roofs, "copy_timing", lambda device: (2**30, Timing([0.002] * 3)))    # 1.07 TB/s
    monkeypatch.setattr(items, "generate", _stand_in_generate)
    assert gpu_check.main(["--out", str(tmp_path), "--only", "bandwidth", "decode_bs1"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    copy = report["items"][0]["rows"]["copy"]
    rows = [row for row in report["items"][1]["rows"].values() if row.get("status") != "skipped"]
    assert len(rows) == 4
    line = next(line for line in printed.splitlines() if "decode_bs1:" in line and "tok/s" in line)
    assert all("of copy bandwidth" in part for part in line.split("; ")[:-1] if "CUDAGraph step: skipped" not in part)
    if sheet is None:
        said = f"no data sheet figure for {name or items.device_name('cpu')}"
        assert copy["fraction_of_data_sheet"] is None and all(r["fraction_of_data_sheet"] is None for r in rows)
        assert line.endswith(said) and f"GiB ({said})" in printed and "of the data sheet's" not in line
        return
    assert copy["fraction_of_data_sheet"] == pytest.approx(2**31 / 0.002 / sheet[1])
    for row in rows:
        assert row["fraction_of_data_sheet"] == pytest.approx(row["fraction_of_bandwidth"] * 2**31 / 0.002 / sheet[1])
    data_sheet = f"data sheet: {sheet[0]} HBM {sheet[1] / 1e12:.2f} TB/s"
    assert line.endswith(data_sheet) and line.count("of the data sheet's") == 4
    assert f"({copy['fraction_of_data_sheet']:.0%} of the {data_sheet})" in printed


# --- a batch-1 row replayed from one torch.cuda.CUDAGraph, beside cudagraph trees' (issue 51, item 9) ---

@pytest.mark.parametrize("where", ["rehearsal", "lent", "capture fails"])  # "gpu" would mark it GPU-only
def test_decode_bs1_sets_a_torch_cuda_graph_row_beside_the_trees_row_and_skips_it_on_a_cpu(
        gpu_check, monkeypatch, where):
    """The manual graph's row tells a slowdown of cudagraph trees (pytorch#174575) from ours. It cannot
    run on a CPU: the rehearsal's row is skipped with its reason and the item stays ok. With a GPU
    (here: the context says so, and the step's timing is a stand-in) it is a row with its fractions;
    a step that cannot be captured fails the row in one sentence."""
    from labsupport.engine.graphs import CaptureFailed
    from labsupport.lab import step_timing
    items = gpu_check.gpu_items
    ctx = _context(gpu_check)
    ctx.bandwidth = 1e11
    monkeypatch.setattr(items, "generate", _stand_in_generate)
    asked = []

    def graphed_decode_seconds(model, batch, context):
        asked.append((batch, context))
        if where == "capture fails":
            raise CaptureFailed("the fixed-shape decode step at batch 1 could not be captured as a CUDA graph (x)")
        return 1 / 4000
    monkeypatch.setattr(step_timing, "graphed_decode_seconds", graphed_decode_seconds)
    if where != "rehearsal":
        ctx.gpu = True                       # the rows' paths are the rehearsal's; only the manual row asks
        monkeypatch.setattr(items, "expected_path", lambda ctx: "compiled")
    result = items.decode_bs1(ctx)
    row = ctx.rows["large (tiny-llama) torch.cuda.CUDAGraph step"]
    assert list(ctx.rows)[-1] == "large (tiny-llama) torch.cuda.CUDAGraph step" and len(ctx.rows) == 5
    if where == "rehearsal":
        assert asked == [] and row["status"] == "skipped" and result["ok"] is True
        assert "torch.cuda.CUDAGraph step: skipped (torch.cuda.CUDAGraph captures CUDA work only, and this " \
               "rehearsal runs on the CPU)" in result["headline"]
        assert result["trees_step_over_manual_graph_step"] is None
    elif where == "lent":
        assert asked == [(1, len(items.PROMPT) + ctx.new_tokens // 2)] and row["ok"] and result["ok"]
        assert row["tokens_per_s"] == 4000 and row["fraction_of_bandwidth"] > 0
        assert result["trees_step_over_manual_graph_step"] == pytest.approx(4.0)     # 1000 tok/s against 4000
    else:
        assert row["ok"] is False and result["ok"] is False
        assert "CUDAGraph step: FAILED: the fixed-shape decode step at batch 1 could not be captured" in \
            result["headline"]
