"""Bad input gets one clear sentence; the benchmark command writes its figures as JSON."""

import json
import math
import subprocess
import sys

import pytest
import torch

from labsupport.bench import BenchContext, BenchOptions, all_figures, run, write_json
from labsupport.bench.baseline import section_baseline
from labsupport.bench.kv_cache import section_kv_cache
from labsupport.bench.options import NEW_TOKENS_FIELDS, REPEATS_FIELDS
from labsupport.errors import LabError, MissingPackage, UnsupportedDtype, require_package
from labsupport.weights.loading import load_model


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "labsupport", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, words", [
    (["bench", "--model", "no-such-model"], "Unknown model name"),
    (["bench", "--sections", "warp-drive"], "Unknown section"),
    (["tour", "--new-tokens", "0"], "new_tokens must be at least 1"),
    (["bench", "--kv-lengths"], "kv_lengths needs at least one value"),
    (["bench", "--device", "cuda"] if not torch.cuda.is_available() else ["bench", "--repeats", "0"],
     "CUDA was requested" if not torch.cuda.is_available() else "repeats must be"),
])
def test_cli_mistakes_print_one_sentence(args, words):
    done = run_cli(*args)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("changes, words", [
    ({"new_tokens": 0}, "new_tokens must be at least 1, got 0"),
    ({"repeats": -2}, "repeats must be at least 1"),
    ({"spec_k": 2.5}, "spec_k must be a whole number"),
    ({"quant_new_tokens": 1}, "quant_new_tokens must be at least 2"),
    ({"kv_naive_budget_s": math.nan}, "kv_naive_budget_s must be finite"),
    ({"kv_naive_budget_s": -1.0}, "kv_naive_budget_s must be finite and >= 0"),
    ({"kv_lengths": []}, "kv_lengths needs at least one value"),
    ({"batch_sizes": [1, 0]}, "every value of batch_sizes must be at least 1"),
    ({"roofline_batches": "1 2"}, "roofline_batches must be a list of whole numbers"),
])
def test_bench_options_refuse_bad_values_in_one_sentence(changes, words):
    with pytest.raises(LabError, match=words) as err:
        BenchOptions(**changes)
    assert "\n" not in str(err.value)


def test_bench_options_presets_and_the_command_line_flags():
    cpu, gpu = BenchOptions.for_device("cpu"), BenchOptions.for_device("cuda")
    assert cpu == BenchOptions() == BenchOptions.cpu()
    assert gpu == BenchOptions.gpu() and gpu.serving_slots == 64 and max(gpu.batch_sizes) > max(cpu.batch_sizes)
    assert cpu.to_dict()["kv_lengths"] == [64, 256, 1024]                  # JSON-ready: lists, not tuples
    assert BenchOptions.from_cli("cpu") == cpu                              # no flag: the preset
    flags = BenchOptions.from_cli("cpu", new_tokens=8, repeats=2, kv_lengths=[4, 16])
    assert all(getattr(flags, name) == 8 for name in NEW_TOKENS_FIELDS)     # --new-tokens reaches them all
    assert all(getattr(flags, name) == 2 for name in REPEATS_FIELDS)        # --repeats too
    assert flags.kv_lengths == (4, 16) and flags.quant_slow_new_tokens == 8
    tiny = BenchOptions.from_cli("cpu", new_tokens=1)
    assert tiny.new_tokens == 1 and tiny.quant_new_tokens == tiny.quant_slow_new_tokens == 2
    with pytest.raises(LabError, match="Unknown section"):
        run(["warp-drive"], device="cpu")


def test_dtype_the_device_cannot_run(monkeypatch):
    with pytest.raises(UnsupportedDtype) as err:
        load_model("tiny-llama", device="cpu", dtype=torch.int8)
    assert "\n" not in str(err.value)


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
    options = BenchOptions(new_tokens=6, repeats=1, kv_lengths=[4])
    baseline = section_baseline(ctx, options)
    kv = section_kv_cache(ctx, options)
    assert baseline["same_tokens_as_huggingface"] is True
    assert baseline["weight_bytes_per_token"] == smollm[0].weight_bytes()
    assert all(r["same_tokens"] for r in kv["rows"])
    assert all(0 < r["cached_bandwidth_fraction"] for r in kv["rows"] if "cached_bandwidth_fraction" in r)
    report = {"sections": {"baseline": baseline, "kv_cache": kv}}
    path = write_json(report, tmp_path / "bench.json")
    names = [f["name"] for f in all_figures(json.loads(path.read_text()))]
    assert any("HF generate" in n for n in names) and any("KV cache speedup" in n for n in names)


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
