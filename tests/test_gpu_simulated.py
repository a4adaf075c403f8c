"""What labsupport chooses on a T4, an A100 and an H100, with torch.cuda's queries patched
(tests/simulated_gpu.py). No CUDA kernel runs here: that is `make gpu-check` on a real GPU.

A T4 (compute capability 7.5, 15 GB) is what most learners get on Colab: no bf16 units,
so fp16 is offered instead of bf16, and every GPU workload must fit in its memory.
"""

import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from labsupport.lab import batching, roofline
from labsupport.delivery import describe_runtime
from labsupport.errors import UnsupportedDtype
from labsupport.engine.hardware import (bf16_emulated, bf16_supported, device_name, dtype_label, fp16_fast,
                                        pick_device, pick_dtype, require_usable_dtype)
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.engine.config import PRESETS as MODELS
from labsupport.lab.workloads import PRESETS, device_class, preset

from simulated_gpu import GPUS, simulated

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

CUDA = torch.device("cuda")


@pytest.fixture(params=sorted(GPUS), ids=str)
def gpu(request):
    with simulated(GPUS[request.param]) as simulated_gpu:
        yield simulated_gpu


def test_the_gpu_is_picked_and_named(gpu):
    assert pick_device() == CUDA
    assert device_name(CUDA) == gpu.name
    assert device_class(CUDA) == "gpu" and preset(CUDA) is PRESETS["gpu"]


def test_bf16_where_the_gpu_has_it_else_fp16(gpu):
    has_bf16 = gpu.capability >= (8, 0)
    assert bf16_supported(CUDA) is has_bf16
    assert pick_dtype(CUDA) == (torch.bfloat16 if has_bf16 else torch.float16)
    assert fp16_fast(CUDA) and not bf16_emulated(CUDA)
    assert dtype_label(CUDA, torch.float16) == "float16"          # never "(emulated)" on a GPU
    require_usable_dtype(CUDA, torch.float16)                      # every CUDA GPU runs fp16
    if has_bf16:
        require_usable_dtype(CUDA, torch.bfloat16)
    else:
        with pytest.raises(UnsupportedDtype, match=r"Tesla T4.*7\.5.*8\.0.*float16"):
            require_usable_dtype(CUDA, torch.bfloat16)


def test_describe_runtime_names_the_gpu_and_its_bf16(gpu):
    line = describe_runtime()
    assert f"device cuda ({gpu.name})" in line
    assert f"bf16 in hardware: {'yes' if gpu.capability >= (8, 0) else 'no'}" in line
    assert "decode steps eager unless a cell says otherwise" in line       # every figure's path, said once


def test_the_sweeps_take_the_gpu_sizes(gpu):
    assert roofline.decode_batches(CUDA) == list(PRESETS["gpu"].roofline_batches)
    assert batching.batch_sizes(CUDA) == list(PRESETS["gpu"].batch_sizes)
    assert max(batching.batch_sizes(CUDA)) > max(batching.batch_sizes("cpu"))
    assert preset(CUDA).kv_explorer_max_length > preset("cpu").kv_explorer_max_length


def peak_bytes_estimate(batch: int, tokens: int, dtype=torch.float32) -> int:
    """A generous upper bound of one run's GPU memory with the embedded model: the weights,
    a KV cache for `tokens` positions of `batch` rows, and the widest activations (the MLP's
    gate and up projections and their product for every position of a prefill) three times over."""
    config = MODELS["smollm2-135m"]
    size = torch.empty((), dtype=dtype).element_size()
    weights = 135e6 * size
    activations = 3 * batch * tokens * config.intermediate_size * size * 3
    return int(weights + kv_cache_bytes(config, tokens, batch, dtype) + activations)


def test_every_gpu_workload_fits_a_t4():
    """The GPU presets are sized so that a free Colab T4 (15 GiB) holds every run in fp32."""
    t4 = GPUS["T4"].total_memory
    gpu = PRESETS["gpu"]
    runs = {
        "roofline sweep (notebook 00)": (max(gpu.roofline_batches), 64 + 1),
        "batching sweep (notebook 02)": (max(gpu.batch_sizes), 64 + 32),
        "KV-cache explorer (notebook 01)": (1, gpu.kv_explorer_max_length),
        "precision prefill (notebook 03)": (1, gpu.precision.prefill_tokens),
        "serving (notebook 06)": (gpu.serving_slots, 64 + 256),
        "stack (notebook 07)": (gpu.stack.slots, 64 + 64),
    }
    too_big = {name: f"{peak_bytes_estimate(*shape) / 2**30:.1f} GiB" for name, shape in runs.items()
               if peak_bytes_estimate(*shape) > 0.8 * t4}
    assert not too_big, f"these GPU workloads may not fit a T4: {too_big}"


def test_notebook_08s_caches_fit_every_gpu_and_a_binder_cpu(gpu):
    """Notebook 08 times three models' caches (MHA, GQA, MQA) side by side, and a float and an
    int8 cache side by side: their batch comes from the free memory (`batch_that_fits`), so on
    a T4 they fit in half of it (three fp32 caches of 8,000 positions at batch 16 would be 23.8
    GiB), and the sweep's single largest cache fits too. On a CPU they stay within the preset's
    budget, which Binder's 2 GiB holds beside the model."""
    from labsupport.lab.long_context_bytes import kv_head_variants
    from labsupport.lab.long_context import batch_that_fits
    from labsupport.lab.workloads import LONG_CONTEXT_PRESETS
    config = MODELS["smollm2-135m"]
    variants = list(kv_head_variants(config).values())
    for name in ("gpu", "cpu"):
        work = LONG_CONTEXT_PRESETS[name]
        device, budget = ("cuda", gpu.total_memory // 2) if name == "gpu" else ("cpu", work.cache_budget_bytes)
        with simulated(gpu):
            batch = batch_that_fits(variants, work.long_context, device, budget_bytes=work.cache_budget_bytes)
            pair = batch_that_fits([config, config], work.long_context, device, largest=max(work.decode_batches),
                                   budget_bytes=work.cache_budget_bytes)
        together = sum(kv_cache_bytes(c, work.long_context + 1, batch) for c in variants)
        assert together <= budget, (name, batch, together / 2**30)
        assert 2 * kv_cache_bytes(config, work.long_context + 1, pair) <= budget, (name, pair)
        assert batch >= 1 and pair >= 1
        if name == "gpu":
            # the decode sweep's largest cache, one at a time, beside the fp32 weights (a decode step's
            # activations are one position per row: small)
            largest = kv_cache_bytes(config, max(work.decode_contexts) + 1, max(work.decode_batches)) + 135e6 * 4
            assert largest < 0.8 * GPUS["T4"].total_memory, f"{largest / 2**30:.1f} GiB"
    assert budget + 135e6 * 4 < 1.5 * 2**30                              # the CPU budget beside the fp32 model


def test_a_cpu_needs_a_cache_budget():
    from labsupport.errors import LabError
    from labsupport.lab.long_context import batch_that_fits
    with pytest.raises(LabError, match="needs budget_bytes on a CPU"):
        batch_that_fits([MODELS["smollm2-135m"]], 100, "cpu")


def test_the_bandwidth_probe_fits_the_free_memory(gpu):
    from unittest import mock

    from labsupport.lab.roofs import CUDA_COPY_BYTES, default_copy_bytes
    free, _ = torch.cuda.mem_get_info(CUDA)
    assert default_copy_bytes(CUDA) == min(CUDA_COPY_BYTES, free // 8)   # 4 GiB buffers on a large GPU
    if gpu.total_memory > 40 * 2**30:
        assert default_copy_bytes(CUDA) == CUDA_COPY_BYTES
    with mock.patch.object(torch.cuda, "mem_get_info", return_value=(2 * 2**30, gpu.total_memory)):
        assert default_copy_bytes(CUDA) == 2 * 2**30 // 8              # a MIG slice with 2 GiB free


def test_the_int4_kernel_is_offered_from_capability_8_only(gpu):
    from labsupport.engine.quant.kernels import int4_kernel_unavailable
    reason = int4_kernel_unavailable(CUDA, group_size=32, in_features=576)
    if gpu.capability >= (8, 0):
        assert reason is None
        assert "multiple of 32" in int4_kernel_unavailable(CUDA, group_size=32, in_features=600)
    else:
        assert reason == "the tinygemm int4 kernel needs compute capability 8.0 or newer, and this Tesla T4 has 7.5"
    assert "group sizes" in int4_kernel_unavailable(CUDA, group_size=16, in_features=576)


def test_int4_on_a_t4_falls_back_to_the_reference_with_the_reason():
    """An int4 layer built for a T4 never tries tinygemm: the reason is kept and shown. (The
    layer's weights stay on the CPU here; only the kernel decision is asked about "cuda".)"""
    from unittest import mock

    from labsupport.engine.quant import kernels as quantize_kernels
    original = quantize_kernels.int4_kernel_unavailable
    linear = torch.nn.Linear(64, 64, bias=False)
    on_cuda = "it is a CPU kernel and this layer is on cuda"            # what W4A8 says of a CUDA layer
    with simulated(GPUS["T4"]), mock.patch.object(quantize_kernels, "int4_kernel_unavailable",
                                                  lambda device, group, n: original(CUDA, group, n)), \
            mock.patch.object(quantize_kernels.Int4Linear, "_build_w4a8", lambda self, *args: on_cuda):
        with pytest.warns(UserWarning, match="compute capability 8.0"):
            layer = quantize_kernels.Int4Linear.from_linear(linear, group_size=32, kernel="auto")
    assert layer.kernel == "reference" and "Tesla T4 has 7.5" in layer.fallback_reason


def test_timing_on_a_gpu_always_warms_up_once(gpu):
    """The first call of a shape compiles and records the decode step on a GPU, so the timing
    harness never times it, even where a caller asked for no warm-up (a CPU has nothing to warm)."""
    from labsupport.lab.measure import time_fn, time_side_by_side
    calls = []
    time_fn(lambda: calls.append(1), CUDA, warmup=0, repeats=3)
    assert len(calls) == 4
    counted = {"a": [], "b": []}
    time_side_by_side({k: (lambda k=k: counted[k].append(1)) for k in counted}, CUDA, warmup=0, repeats=2)
    assert [len(v) for v in counted.values()] == [3, 3]
    calls.clear()
    time_fn(lambda: calls.append(1), "cpu", warmup=0, repeats=3)
    assert len(calls) == 3


def test_a_gpu_times_the_17b_shape_where_its_memory_holds_it_and_a_t4_in_16_bit(gpu):
    """The 1.7B shape is timed where its weights take at most a quarter of the GPU: in 16-bit on
    every GPU here (a T4's 15 GiB holds 3.4 GB), in fp32 only from 26 GiB (not a T4: fp16 there)."""
    from labsupport.lab.timing_model import timed_dtype
    from labsupport.lab.workloads import TIMING_MODEL, TIMING_MODEL_PARAMETERS, timing_model_name
    assert TIMING_MODEL_PARAMETERS == MODELS[TIMING_MODEL].num_parameters
    sixteen = pick_dtype(CUDA)
    assert timing_model_name(CUDA, sixteen) == TIMING_MODEL
    fp32_fits = 4 * MODELS[TIMING_MODEL].num_parameters * 4 <= gpu.total_memory
    assert timing_model_name(CUDA) == (TIMING_MODEL if fp32_fits else None)
    assert fp32_fits is (gpu.name != "Tesla T4")
    assert timed_dtype(CUDA, torch.float32) == (torch.float32 if fp32_fits else torch.float16)
    assert timed_dtype(CUDA, sixteen) == sixteen
    assert timing_model_name("cpu") is None
    big = MODELS[TIMING_MODEL]
    assert big.num_layers == 24 and big.hidden_size == 2048        # SmolLM2-1.7B's shape


def test_the_bench_context_times_the_courses_model_on_a_cpu():
    from labsupport.bench.core import BenchContext
    ctx = BenchContext(device=torch.device("cpu"), model_name="tiny-llama")
    model, name = ctx.timing_model(torch.float32)
    assert model is ctx.model(torch.float32)[0] and name == "tiny-llama"


def _timing_choice(machine):
    """What the real `workloads.timing_model_name` answers on `machine` (a `GPUS` key, simulated, or "CPU")."""
    from labsupport.lab.workloads import timing_model_name
    if machine == "CPU":
        return timing_model_name("cpu")
    with simulated(GPUS[machine]):
        return timing_model_name(CUDA)


def _bench_as_on(machine, monkeypatch):
    """A CPU `BenchContext` on tiny-llama that picks its timed model as `machine` would
    (`_timing_choice`); the model it asks for is built as a wider tiny-llama ("stand-in"), since
    no 1.7B model is built in a test. Returns the context and the names `random_model` was asked for."""
    from labsupport.bench import core
    from labsupport.weights.fixtures import random_model
    choice = _timing_choice(machine)
    asked = []
    stand_in = MODELS["tiny-llama"].with_(hidden_size=128, intermediate_size=256, name="stand-in")
    monkeypatch.setattr(core, "timing_model_name", lambda device: choice)
    monkeypatch.setattr(core, "random_model", lambda name, **kw: asked.append(name) or random_model(stand_in, **kw))
    return core.BenchContext(torch.device("cpu"), model_name="tiny-llama"), asked


def _spy(monkeypatch, module, name, seen):
    """Replace `module.name` with a wrapper that records the model it is called with first."""
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda model, *a, **k: seen.append(model.config.name) or real(model, *a, **k))


@pytest.mark.parametrize("machine", ["A100", "H100", "T4", "CPU"])
def test_quantization_and_precision_time_speed_on_the_timing_model_and_quality_on_the_courses(machine, monkeypatch):
    """On a big GPU the speed rows of notebooks 03's and 04's sections time variants of the model at
    SmolLM2-1.7B's shape (named in ``timed_model`` and in every speed figure's note); perplexity,
    agreement and bytes stay the course's model's. A T4 and a CPU time the course's model."""
    import labsupport.bench.precision as bench_precision
    import labsupport.bench.quantization as bench_quantization
    from labsupport.bench.precision import PrecisionOptions
    from labsupport.bench.quantization import QuantizationOptions
    from labsupport.lab.quality import resident_bytes
    from labsupport.lab.workloads import TIMING_MODEL
    ctx, asked = _bench_as_on(machine, monkeypatch)
    big = machine in ("A100", "H100")
    expected, timed_config = (f"{TIMING_MODEL} (random weights)", "stand-in") if big else ("tiny-llama", "tiny-llama")
    timed, scored = [], []
    _spy(monkeypatch, bench_quantization, "generate", timed)
    _spy(monkeypatch, bench_quantization, "logits_of", scored)
    _spy(monkeypatch, bench_precision, "decode_run", timed)
    _spy(monkeypatch, bench_precision, "prefill_run", timed)
    _spy(monkeypatch, bench_precision, "logit_agreement", scored)

    quantization = bench_quantization.section_quantization(
        ctx, QuantizationOptions(new_tokens=3, slow_new_tokens=2, repeats=1, eval_tokens=16))
    precision = bench_precision.section_precision(ctx, PrecisionOptions(new_tokens=2, prefill_tokens=8, repeats=1))
    for section in (quantization, precision):
        assert section["timed_model"] == expected
        speeds = [f for f in section["figures"] if "speed" in f["name"]]
        assert speeds and all(f"model {expected}" in f["note"] for f in speeds)
        assert (f"not {ctx.model_name}" in section["note"]) is big          # the note says why, on a big GPU
    assert set(timed) == {timed_config} and set(scored) == {"tiny-llama"}
    assert set(asked) == ({TIMING_MODEL} if big else set())
    int8 = quantization["rows"]["int8"]
    assert int8["tensor_bytes"] == resident_bytes(ctx.variants.get("fp32", "int8"))   # the course's bytes
    assert int8["kernels"] == ctx.timing_variants.handle("fp32", "int8").kernels     # the timed layers' kernel
    assert (ctx.timing_variants is ctx.variants) is not big


@pytest.mark.parametrize("machine", ["A100", "H100", "T4", "CPU"])
def test_notebooks_00_and_02_sweep_the_timing_model_on_a_gpu(machine, monkeypatch):
    """`timing_model.timing_model`, which notebooks 00 and 02 call before their sweeps: on a GPU a
    model at SmolLM2-1.7B's shape (in the course model's dtype where it fits, fp16 on a T4, one model
    for both; named with the reason), on a CPU the course's model itself."""
    import json
    from pathlib import Path

    from labsupport.engine import hardware
    from labsupport.lab import timing_model as timing
    from labsupport.lab.workloads import TIMING_MODEL, timing_model_name
    from labsupport.weights.fixtures import random_model

    def as_on(function):                     # answers as `machine` would (a test model lives on the CPU)
        if machine == "CPU":
            return lambda device, *args: function("cpu", *args)
        return lambda device, *args: _simulated_call(machine, function, *args)
    asked = []
    monkeypatch.setattr(timing, "timing_model_name", as_on(timing_model_name))
    monkeypatch.setattr(timing, "pick_dtype", as_on(hardware.pick_dtype))
    monkeypatch.setattr(timing, "random_model", lambda name, **kw: asked.append((name, kw["dtype"]))
                        or random_model("tiny-gpt2", **kw).to(kw["dtype"]))
    course = random_model("tiny-llama")                                   # fp32, as notebook 02 loads it
    model, name = timing.timing_model(course)
    sixteen, _ = timing.timing_model(course.to(torch.float16))           # notebook 00's second sweep on a T4
    if machine == "CPU":
        assert model is course and name == "tiny-llama" and not asked
    else:
        expected = torch.float16 if machine == "T4" else torch.float32
        assert model is not course and model.dtype == expected and asked[0] == (TIMING_MODEL, expected)
        assert name == f"{TIMING_MODEL} (random weights)"
        assert "launch-bound" in timing.timed_model_sentence(name, "tiny-llama")
        assert (sixteen is model) is (machine == "T4")                     # a T4 builds one fp16 model
    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    for notebook, sweep in (("00_where_the_time_goes", "roofline.sweep_decode(model"),
                            ("02_batching", "sweep_batch_sizes(sweep_model")):
        code = "\n".join("".join(c["source"]) for c in json.loads((notebooks / f"{notebook}.ipynb").read_text())["cells"]
                         if c["cell_type"] == "code")
        assert "timing_model(" in code and sweep in code and "timed_model_sentence(" in code


def _simulated_call(machine, function, *args):
    """`function(CUDA, *args)` answered as on the simulated `machine`."""
    with simulated(GPUS[machine]):
        return function(CUDA, *args)


# --- every GPU workload fits the GPU's memory, for every model shape ---------------------------

SHAPES = {"smollm2-135m": MODELS["smollm2-135m"],
          "smollm2-360m": MODELS["smollm2-135m"].with_(hidden_size=960, num_layers=32, num_heads=15, num_kv_heads=5,
                                                       intermediate_size=2560, name="smollm2-360m"),
          "smollm2-1.7b": MODELS["smollm2-1.7b-shape"].with_(name="smollm2-1.7b")}   # the hub model's shape
CUDA_CONTEXT = 2**29            # what the CUDA context and the allocator take before any tensor (0.5 GiB)


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _need(resident: int, config, batch: int, positions: int, dtype, tokens: int = 1) -> int:
    """This test's own count of one run's memory: resident weights, the CUDA context, the KV cache,
    and an activations margin (fp32 logits and the MLP's three intermediates per new token, twice)."""
    size = _size(dtype)
    activations = 2 * batch * (config.vocab_size * 4 + tokens * 3 * config.intermediate_size * size)
    return resident + CUDA_CONTEXT + kv_cache_bytes(config, positions, batch, dtype) + activations


def _batches_swept(monkeypatch, module, measure: str, sweep, resident: int, gpu):
    """The batch sizes a sweep of `module` really times with `resident` bytes of weights loaded:
    torch.cuda reports the rest free, and `measure` (the per-point timer) only records its batch."""
    seen = []
    monkeypatch.setattr(module, measure, lambda model, batch_or_prompts, *a, **k: seen.append(
        batch_or_prompts if isinstance(batch_or_prompts, int) else len(batch_or_prompts)) or {})
    free = gpu.total_memory - CUDA_CONTEXT - resident
    with mock.patch.object(torch.cuda, "mem_get_info", return_value=(free, gpu.total_memory)), \
            warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rows = sweep()
    assert bool(rows.note) == bool(said)                   # a sweep that left points out says so
    return seen, rows.note


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_gpu_sweep_fits_the_gpus_memory(gpu, shape, monkeypatch):
    """Notebooks 00, 02 and 08 load the course model (fp32, and every 16-bit dtype in 00) and, where it
    is smaller than 1.7B, a timing model; their sweeps then size batch and context from the free
    memory. Weights + the largest cache each sweep times + an activations margin fit the GPU."""
    from types import SimpleNamespace

    from labsupport.lab import batching_timing
    from labsupport.lab.long_context import batch_that_fits, contexts_that_fit, share_budget
    from labsupport.lab.timing_model import timed_dtype
    from labsupport.lab.workloads import LONG_CONTEXT_PRESETS, TIMING_MODEL, timing_model_name
    config, total = SHAPES[shape], gpu.total_memory

    def weights(cfg, dtype):
        return cfg.num_parameters * _size(dtype)

    def timed(dtype):                       # (config, dtype) a sweep in `dtype` times: `timing_model`'s rule
        if timing_model_name(CUDA, pick_dtype(CUDA)) and config.num_parameters < MODELS[TIMING_MODEL].num_parameters:
            return MODELS[TIMING_MODEL], timed_dtype(CUDA, dtype)
        return config, dtype

    # notebook 00: the course model in every dtype the probe offers, and their timing models (one per dtype)
    dtypes = [torch.float32] + ([torch.bfloat16] if gpu.capability >= (8, 0) else []) + [torch.float16]
    sweeps = {timed(d) for d in dtypes}
    resident = sum(weights(config, d) for d in dtypes) + sum(weights(c, d) for c, d in sweeps if c is not config)
    for cfg, dtype in sweeps:
        model = SimpleNamespace(config=cfg, dtype=dtype, device=CUDA)
        batches, _ = _batches_swept(monkeypatch, roofline, "measure_decode_point",
                                    lambda: roofline.sweep_decode(model, context=64), resident, gpu)
        assert batches and _need(resident, cfg, max(batches), 65, dtype) <= total, (cfg.name, dtype, batches)

    # notebook 02: the course model in fp32, the sweep on its timing model, a prompt of 40 tokens + 64 new ones
    cfg, dtype = timed(torch.float32)
    resident = weights(config, torch.float32) + (weights(cfg, dtype) if cfg is not config else 0)
    model = SimpleNamespace(config=cfg, dtype=dtype, device=CUDA)
    batches, _ = _batches_swept(monkeypatch, batching_timing, "measure_batch", lambda: batching_timing.sweep_batch_sizes(
        model, [1] * 40, batching.batch_sizes(CUDA), 64), resident, gpu)
    assert batches and _need(resident, cfg, max(batches), 104, dtype, tokens=40) <= total, (cfg.name, batches)

    # notebook 08: the course model in fp32; the decode-share sweep's caches, and the float/int8 pair's two
    work, resident = LONG_CONTEXT_PRESETS["gpu"], weights(config, torch.float32)
    free = total - CUDA_CONTEXT - resident
    with mock.patch.object(torch.cuda, "mem_get_info", return_value=(free, total)):
        for batch in work.decode_batches:
            longest = max(contexts_that_fit(config, work.decode_contexts, batch, torch.float32, share_budget(CUDA)))
            assert _need(resident, config, batch, longest + 1, torch.float32) <= total, (batch, longest)
        pair = batch_that_fits([config, config], work.long_context, CUDA, largest=max(work.decode_batches))
    assert resident + CUDA_CONTEXT + 2 * kv_cache_bytes(config, work.long_context + 1, pair) <= total

    if gpu.name == "Tesla T4" and shape == "smollm2-1.7b":      # the old sizing, uncapped, does not fit: this test can fail
        assert _need(weights(config, torch.float32), config, max(PRESETS["gpu"].roofline_batches), 65,
                     torch.float32) > total
        assert _need(resident, config, max(work.decode_batches), max(work.decode_contexts) + 1, torch.float32) > total


def test_a_capped_sweep_says_what_it_left_out():
    """A sweep that leaves points out returns a `Sweep` whose note names them, and warns; on a CPU
    08's decode-share sweep keeps its caches within the CPU budget (768 MiB beside the model)."""
    from labsupport.lab.long_context import contexts_that_fit, share_budget
    from labsupport.lab.timing_model import SweepCapped, batches_that_fit, capped
    from labsupport.lab.workloads import LONG_CONTEXT_PRESETS
    config = SHAPES["smollm2-1.7b"]
    kept, note = batches_that_fit(config, [1, 4, 512], 65, torch.float16, "cpu",
                                  budget_bytes=kv_cache_bytes(config, 65, 8, torch.float16) + 2**28)
    assert kept == [1, 4] and "Batches [512] left out" in note
    assert batches_that_fit(config, [1, 512], 65, torch.float16, "cpu") == ([1, 512], None)   # a CPU: uncapped
    with pytest.warns(SweepCapped, match="left out"):
        assert capped([{"batch": 1}], note).note == note
    budget = share_budget("cpu")
    assert budget == LONG_CONTEXT_PRESETS["cpu"].cache_budget_bytes and budget <= 2**30
    work = LONG_CONTEXT_PRESETS["cpu"]
    for shape, cfg in SHAPES.items():
        for batch in work.decode_batches:
            longest = max(contexts_that_fit(cfg, work.decode_contexts, batch, torch.float32, budget))
            assert kv_cache_bytes(cfg, longest + 1, batch) <= budget, (shape, batch, longest)
    from labsupport.errors import LabError
    with pytest.raises(LabError, match="not even one fits"):
        contexts_that_fit(config, [64], 16, torch.float32, 2**20)


def test_notebook_08s_new_variant_models_count_their_weights_and_refuse_what_cannot_fit():
    """Notebook 08 builds three random-weight models (MHA, GQA, MQA) for its side-by-side timing:
    their weights come out of the memory too. The 1.7B shape's fp32 variants (MHA and MQA, 12.9 GB)
    do not fit the half of a T4's memory that the GPU preset gives its caches (budget None): one
    sentence says to time them in 16-bit, and in 16-bit they fit."""
    from labsupport.errors import LabError
    from labsupport.lab.long_context_bytes import kv_head_variants
    from labsupport.lab.long_context import batch_that_fits
    variants = list(kv_head_variants(MODELS["smollm2-1.7b-shape"]).values())
    with simulated(GPUS["T4"]):
        budget = torch.cuda.mem_get_info(CUDA)[0] // 2                   # what budget_bytes=None takes
        with pytest.raises(LabError, match="16-bit"):
            batch_that_fits(variants, 1024, CUDA, dtype=torch.float32, new_models=True)
        batch = batch_that_fits(variants, 1024, CUDA, budget_bytes=budget, dtype=torch.float16, new_models=True)
        weights = sum(c.num_parameters for c in variants) * 2
        cache = sum(kv_cache_bytes(c, 1025, batch, torch.float16) for c in variants)
        assert batch >= 1 and weights + cache <= budget
        assert batch < batch_that_fits(variants, 1024, CUDA, budget_bytes=budget, dtype=torch.float16)  # weights counted


def test_the_bench_times_the_sixteen_bit_1_7b_shape_on_a_t4(monkeypatch):
    """On a T4 the bench's roofline and batching sweeps time the 1.7B shape in fp16, as notebook
    00 does, and say so in the model's name; an A100 keeps its fp32 timing variants."""
    from labsupport.bench import core
    from labsupport.lab import timing_model as timing
    built = []

    class Built(SimpleNamespace):                    # timing_model keeps its models weakly
        pass
    monkeypatch.setattr(timing, "random_model", lambda name, seed, device, dtype: built.append((name, dtype))
                        or Built(config=MODELS[name], dtype=dtype, device=device))
    course = SimpleNamespace(config=MODELS["smollm2-135m"], dtype=torch.float32, device=CUDA)
    with simulated(GPUS["T4"]):
        ctx = core.BenchContext(device=CUDA)
        monkeypatch.setattr(core.BenchContext, "model", lambda self, dtype=torch.float32: (course, None))
        model, name = ctx.timing_model(torch.float32)
    assert model.dtype == torch.float16 and built == [("smollm2-1.7b-shape", torch.float16)]
    assert name.endswith("in float16")


def test_notebook_02s_sweep_holds_one_large_cache_at_a_time_on_a_t4():
    """Issue 51, item 1: notebook 02 sweeps the 1.7B shape in fp16 on a T4 (11.41 GiB free beside
    the models), compiled: a prompt of 40 tokens + 64 new ones, a cache of 128 positions per row
    (`bucket_length`). One cache kept per batch point (1 ... 256) would hold 511 rows of it,
    11.98 GiB. The decoder keeps its caches within a T4's budget, so the sweep's peak is its
    largest point's cache, inside the share of the free memory a sweep may take. Sized on the
    meta device: no memory is allocated."""
    from labsupport.engine.compiled import CompiledDecoder, cache_budget, cache_bytes
    from labsupport.lab.timing_model import HEADROOM, batches_that_fit

    class Timed:                                  # what cache_for reads of a model; kept weakly
        config, dtype, device = MODELS["smollm2-1.7b-shape"], torch.float16, torch.device("meta")
    model, needed, free = Timed(), 40 + 64, int(11.41 * 2**30)
    with simulated(GPUS["T4"]), mock.patch.object(torch.cuda, "mem_get_info", return_value=(free, 15 * 2**30)):
        batches, _ = batches_that_fit(model.config, batching.batch_sizes(CUDA), needed, model.dtype, CUDA, tokens=40)
        decoder = CompiledDecoder(keep_bytes=cache_budget(CUDA))
    assert batches[-1] == 256 and decoder.keep_bytes == GPUS["T4"].total_memory // 8
    sizes = [cache_bytes(model.config, batch, needed, model.dtype) for batch in batches]
    assert sum(sizes) > free                      # one cache per point: 11.98 GiB, more than is free
    held = []
    for batch, size in zip(batches, sizes):
        assert decoder.cache_for(model, batch, needed).nbytes == size          # sized by the buckets
        held.append(decoder.held_bytes(model))
    assert max(held) == max(sizes) <= HEADROOM * free, [h / 2**30 for h in held]

