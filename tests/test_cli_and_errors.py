"""Bad input gets one clear sentence; the benchmark command writes its figures as JSON."""

import json
import subprocess
import sys

import pytest
import torch

from labsupport import bench
from labsupport.errors import MissingPackage, UnsupportedDtype, require_package
from labsupport.models.loading import load_model


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "labsupport", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, words", [
    (["bench", "--model", "no-such-model"], "Unknown model name"),
    (["bench", "--sections", "warp-drive"], "Unknown section"),
    (["tour", "--new-tokens", "0"], "--new-tokens must be at least 1"),
    (["bench", "--device", "cuda"] if not torch.cuda.is_available() else ["bench", "--repeats", "0"],
     "CUDA was requested" if not torch.cuda.is_available() else "--repeats must be"),
])
def test_cli_mistakes_print_one_sentence(args, words):
    done = run_cli(*args)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_dtype_the_device_cannot_run(monkeypatch):
    with pytest.raises(UnsupportedDtype) as err:
        load_model("tiny-llama", device="cpu", dtype=torch.int8)
    assert "\n" not in str(err.value)


def test_bf16_on_a_cpu_without_bf16_instructions_loads_emulated(monkeypatch):
    from labsupport import hardware
    monkeypatch.setenv(hardware.NO_BF16_SWITCH, "1")
    model, _ = load_model("tiny-llama", device="cpu", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_missing_optional_package_names_the_pip_command():
    with pytest.raises(MissingPackage, match="pip install no-such-package"):
        require_package("no_such_package", "no-such-package", feature="The test")


@pytest.mark.slow
def test_bench_sections_write_json(tmp_path, smollm, smollm_hf):
    # a small run: the structure and the correctness checks, not the speed
    ctx = bench.BenchContext(device=torch.device("cpu"))
    ctx._cache[("ours", torch.float32)] = smollm
    ctx._cache[("hf", torch.float32)] = smollm_hf
    options = {**bench.DEFAULTS, "new_tokens": 6, "repeats": 1, "kv_lengths": [4]}
    baseline = bench.section_baseline(ctx, options)
    kv = bench.section_kv_cache(ctx, options)
    assert baseline["same_tokens_as_huggingface"] is True
    assert baseline["weight_bytes_per_token"] == smollm[0].weight_bytes()
    assert all(r["same_tokens"] for r in kv["rows"])
    report = {"sections": {"baseline": baseline, "kv_cache": kv}}
    path = bench.write_json(report, tmp_path / "bench.json")
    names = [f["name"] for f in bench.all_figures(json.loads(path.read_text()))]
    assert any("HF generate" in n for n in names) and any("KV cache speedup" in n for n in names)
