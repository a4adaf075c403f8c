"""Bad input gets one clear sentence; the benchmark command writes its figures as JSON."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

from labsupport.bench import SECTIONS, BenchContext, BenchOptions, all_figures, run, write_json
from labsupport.bench.baseline import BaselineOptions, section_baseline
from labsupport.bench.batching import BatchingOptions
from labsupport.bench.kv_cache import KVCacheOptions, section_kv_cache
from labsupport.bench.quantization import QuantizationOptions
from labsupport.bench.roofline import RooflineOptions
from labsupport.bench.serving import ServingOptions
from labsupport.bench.speculative import SpeculativeOptions
from labsupport.errors import LabError, MissingPackage, UnsupportedDtype, require_package
from labsupport.weights.loading import load_model


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "labsupport", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, words", [
    (["bench", "--model", "no-such-model"], "Unknown model name"),
    (["bench", "--sections", "warp-drive"], "Unknown section"),
    (["tour", "--new-tokens", "0"], "new_tokens must be at least 1"),
    (["bench", "--kv-lengths"], "kv_cache.lengths needs at least one value"),
    (["bench", "--device", "cuda"] if not torch.cuda.is_available() else ["bench", "--repeats", "0"],
     "CUDA was requested" if not torch.cuda.is_available() else "repeats must be"),
])
def test_cli_mistakes_print_one_sentence(args, words):
    done = run_cli(*args)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("options, changes, words", [
    (BaselineOptions, {"new_tokens": 0}, "baseline.new_tokens must be at least 1, got 0"),
    (BaselineOptions, {"repeats": -2}, "baseline.repeats must be at least 1"),
    (SpeculativeOptions, {"k": 2.5}, "speculative.k must be a whole number"),
    (QuantizationOptions, {"new_tokens": 1}, "quantization.new_tokens must be at least 2"),
    (KVCacheOptions, {"naive_budget_s": math.nan}, "kv_cache.naive_budget_s must be finite"),
    (KVCacheOptions, {"naive_budget_s": -1.0}, "kv_cache.naive_budget_s must be finite and >= 0"),
    (KVCacheOptions, {"lengths": []}, "kv_cache.lengths needs at least one value"),
    (BatchingOptions, {"sizes": [1, 0]}, "every value of batching.sizes must be at least 1"),
    (RooflineOptions, {"batches": "1 2"}, "roofline.batches must be a list"),
    # rules across fields: refused when the options are made, before any model is loaded (issue 26)
    (ServingOptions, {"token_budget": 4}, r"token_budget \(4\) must be at least slots \(8\)"),
    (ServingOptions, {"curve_slots": 40, "curve_requests": 60}, r"token_budget \(32\) must be at least curve_slots"),
    (ServingOptions, {"curve_slots": 12}, r"curve_slots \(12\) must be fewer than curve_requests \(12\)"),
    (QuantizationOptions, {"new_tokens": 8, "slow_new_tokens": 16}, r"slow_new_tokens \(16\) must not exceed"),
])
def test_section_options_refuse_bad_values_in_one_sentence(options, changes, words):
    for make in (lambda: options(**changes), lambda: dataclasses.replace(options(), **changes)):
        with pytest.raises(LabError, match=words) as err:
            make()
        assert "\n" not in str(err.value) and str(err.value).rstrip(".").count(". ") == 0


def test_a_serving_budget_below_the_slots_is_refused_before_anything_loads(monkeypatch):
    """Issue 26: the bench used to load the models, then refuse the budget inside the section."""
    import labsupport.bench.core as core
    monkeypatch.setattr(core, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(LabError, match="token_budget"):
        BenchOptions.cpu(serving={"token_budget": 4})
    with pytest.raises(LabError, match="token_budget"):
        BenchOptions.gpu(serving={"slots": 600})                     # the GPU budget is 512
    assert BenchOptions.gpu().serving.token_budget >= BenchOptions.gpu().serving.slots


def test_bench_options_presets_and_the_command_line_flags():
    cpu, gpu = BenchOptions.for_device("cpu"), BenchOptions.for_device("cuda")
    assert cpu == BenchOptions.cpu() and gpu == BenchOptions.gpu() and list(cpu.sections) == list(SECTIONS)
    assert all(isinstance(cpu[name], section.options) for name, section in SECTIONS.items())
    assert gpu.serving.slots == 64 and max(gpu.batching.sizes) > max(cpu.batching.sizes)
    assert cpu.to_dict()["kv_cache"]["lengths"] == [64, 256, 1024]       # JSON-ready: lists, not tuples
    assert BenchOptions.from_cli("cpu") == cpu                              # no flag: the preset
    flags = BenchOptions.from_cli("cpu", new_tokens=8, repeats=2, kv_lengths=[4, 16])
    for name, options in flags.sections.items():                            # every section with such a count
        for field in dataclasses.fields(options):
            if field.name == "new_tokens":
                assert getattr(options, field.name) == 8, name
            if field.name.endswith("repeats"):
                assert getattr(options, field.name) == 2, (name, field.name)
    counted = [n for n, o in flags.sections.items() if any(f.name == "new_tokens" for f in dataclasses.fields(o))]
    assert counted == ["baseline", "engines", "batching", "precision", "quantization", "speculative", "compile"]
    assert flags.kv_cache.lengths == (4, 16) and flags.quantization.slow_new_tokens == 8
    tiny = BenchOptions.from_cli("cpu", new_tokens=1)
    assert tiny.baseline.new_tokens == 1 and tiny.quantization.new_tokens == tiny.quantization.slow_new_tokens == 2
    assert cpu.changed(kv_cache={"lengths": (4,)}).kv_cache.lengths == (4,) and cpu.kv_cache.lengths[0] == 64
    for bad, words in [(lambda: cpu.changed(warp={"x": 1}), "Unknown section 'warp'"),
                       (lambda: cpu.changed(kv_cache=BaselineOptions()), "must be a KVCacheOptions"),
                       (lambda: BenchOptions({"baseline": BaselineOptions()}), "needs the options of every section"),
                       (lambda: cpu["warp"], "No section named 'warp'")]:
        with pytest.raises(LabError, match=words):
            bad()
    with pytest.raises(LabError, match="Unknown section"):
        run(["warp-drive"], device="cpu")


@pytest.mark.parametrize("command", ["bench", "tour"])
def test_an_output_that_cannot_be_written_is_refused_before_measuring(command, tmp_path):
    """Issue 26: a bad --out used to crash after the whole run; now one sentence before anything runs."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / ("bench.json" if command == "bench" else "reports")
    done = run_cli(command, "--sections", "baseline", "--out", str(out))
    assert done.returncode == 2
    err = done.stderr.strip()
    assert f"Cannot write {out}" in err and "--out" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "[bench]" not in done.stdout                                      # nothing was measured
    writable = tmp_path / "fine" / "bench.json"
    from labsupport.bench.core import require_writable
    assert require_writable(writable) == writable and not writable.exists() and writable.parent.is_dir()


@pytest.mark.platform
def test_dtype_the_device_cannot_run(monkeypatch):
    with pytest.raises(UnsupportedDtype) as err:
        load_model("tiny-llama", device="cpu", dtype=torch.int8)
    assert "\n" not in str(err.value)


@pytest.mark.platform
def test_bf16_on_a_cpu_without_bf16_instructions_loads_emulated(monkeypatch):
    from labsupport.engine import hardware
    monkeypatch.setenv(hardware.NO_BF16_SWITCH, "1")
    model, _ = load_model("tiny-llama", device="cpu", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_missing_optional_package_names_the_pip_command():
    with pytest.raises(MissingPackage, match="pip install no-such-package"):
        require_package("no_such_package", "no-such-package", feature="The test")


@pytest.mark.slow
def test_bench_sections_write_json(tmp_path, smollm, smollm_hf):
    # a small run: the structure and the correctness checks, not the speed
    ctx = BenchContext(device=torch.device("cpu"))
    ctx._cache[("ours", torch.float32)] = smollm
    ctx._cache[("hf", torch.float32)] = smollm_hf
    baseline = section_baseline(ctx, BaselineOptions(new_tokens=6, repeats=1))
    kv = section_kv_cache(ctx, KVCacheOptions(lengths=[4]))
    assert baseline["same_tokens_as_huggingface"] is True
    assert baseline["weight_bytes_per_token"] == smollm[0].weight_bytes()
    assert all(r["same_tokens"] for r in kv["rows"])
    assert all(0 < r["cached_bandwidth_fraction"] for r in kv["rows"] if "cached_bandwidth_fraction" in r)
    report = {"sections": {"baseline": baseline, "kv_cache": kv}}
    path = write_json(report, tmp_path / "bench.json")
    names = [f["name"] for f in all_figures(json.loads(path.read_text()))]
    assert any("HF generate" in n for n in names) and any("KV cache speedup" in n for n in names)
    # issue 54: the decode's bandwidth against the read probe timed in the same rounds, the copy's beside it
    read = next(f for f in baseline["figures"] if f["name"] == "decode bandwidth achieved / measured read bandwidth")
    assert read["value"] == pytest.approx(baseline["bandwidth_achieved_bytes_per_s"]
                                          / baseline["read_bandwidth_bytes_per_s"])
    assert read["target"] == 0.9 and "of the copy's" in read["note"]
    assert baseline["timings_s"]["read"]["median"] > 0
    from labsupport.plots.sections import baseline_figures
    assert "measured read bandwidth" in list(baseline_figures(baseline)[1].data[0].x)


def test_first_line_gives_an_errors_gist_for_the_middle_of_a_sentence():
    from labsupport.errors import first_line
    assert first_line(RuntimeError("  no kernel image.\nTraceback (most recent call last): ...")) == "no kernel image"
    assert first_line(ValueError("")) == "ValueError"                       # an empty message: the type
    assert first_line(OSError("x" * 300), limit=20) == "x" * 17 + "..."
    assert first_line(KeyError("shape"), with_type=True) == "KeyError: 'shape'"
    assert first_line(ValueError("\n\n"), with_type=True) == "ValueError"
    # the one home: no module of the package cuts an error's first line by hand any more
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent / "labsupport"
    copies = [p.name for p in root.rglob("*.py") if "splitlines()[0]" in p.read_text() and p.name != "cli.py"]
    assert copies == []


def test_bench_options_copy_and_read_like_the_sections():
    import copy
    import pickle
    options = BenchOptions.gpu(stack={"repeats": 3})
    assert copy.deepcopy(options) == options == pickle.loads(pickle.dumps(options))
    assert options.stack.repeats == 3 and options["stack"] is options.stack
    assert getattr(options, "warp", None) is None and not hasattr(options, "warp")
    with pytest.raises(AttributeError, match="no section 'warp'"):
        options.warp
