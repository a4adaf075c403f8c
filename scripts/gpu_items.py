"""The items of `scripts/gpu_check.py`: gates first, then measurements, each a function of a `Context`.

Every item returns a dict with a one-line ``headline``; a gate also returns ``ok``. On a CPU
(the rehearsal) each item runs the same code with the tiny model and small sizes, so that
nothing but the GPU itself is left untested before a GPU run. Figures from a rehearsal do
not count; the JSON says ``"rehearsal": true``.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from labsupport.engine.compiled import COMPILED, CUDA_GRAPHS, bucket_rows
from labsupport.engine.generation import generate
from labsupport.engine.hardware import bf16_supported, device_name, dtype_name
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.engine.config import PRESETS, ModelConfig
from labsupport.engine.models.transformer import Transformer
from labsupport.engine.quant import quantize_model
from labsupport.engine.quant.kernels import Int4Linear, Int8Linear, int4_kernel_unavailable, kernel_description

PROMPT = [1, 42, 217, 31, 253, 145, 28, 155, 82, 253, 235, 135]     # 12 ids inside every vocabulary here (tiny: 260)


# --- the machine and the models ------------------------------------------------------------

def machine() -> dict:
    """What torch sees: versions, the GPU's name, capability and memory (no labsupport choice yet),
    and the build tools Triton needs (`build_tools`: ``c_compiler``, ``python_h``)."""
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.is_available(), **build_tools()}
    if info["gpu"]:
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2**30, 1), count=torch.cuda.device_count(),
                    bf16=bf16_supported(torch.device("cuda")))
    return info


def build_tools() -> dict:
    """What Triton needs to build its launcher for a compiled kernel, found as Triton finds it
    (triton/runtime/build.py): a C compiler (``$CC``, else gcc, else clang) and Python.h in this
    interpreter's include folder (sysconfig's default scheme, posix_local read as posix_prefix).
    Each one's path, None where it is missing. A rehearsal builds the C++ CPU kernels with them too."""
    import os
    import shutil
    import sysconfig
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    compiler = shutil.which(compiler) if compiler else None
    scheme = sysconfig.get_default_scheme()
    header = Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"],
                  "Python.h")
    return {"c_compiler": compiler, "python_h": str(header) if header.is_file() else None}


def missing_build_tools(info: dict) -> list[str]:
    """The build tools `machine()` found missing, named for a sentence: [] when both are there."""
    names = {"c_compiler": "a C compiler (gcc or clang, or $CC)",
             "python_h": "Python.h (the Python headers, e.g. python3-dev)"}
    return [name for key, name in names.items() if not info.get(key)]


def build_cpu_kernels() -> dict:
    """Build (or load from the kernel cache) the C++ CPU kernels a rehearsal runs: the fused norm,
    rotary and SwiGLU ops and the W4A8 int4 kernel. Each one's status (None: loaded, else why not)
    and the seconds the whole took, so that no item's cap pays for a cold build."""
    from labsupport.engine.models import fused
    from labsupport.engine.quant.w4a8 import w4a8_unavailable
    start = time.perf_counter()
    statuses = {"fused": fused.unavailable(), "w4a8": w4a8_unavailable()}
    return {"status": statuses, "seconds": round(time.perf_counter() - start, 1)}


def random_weights(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Transformer:
    """A model of `config`'s shapes with seeded random weights, built on `device` directly (a 1.7B
    model made on the host and copied over would take a minute of the budget). Std 0.02, norms 1."""
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = Transformer(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model.to(dtype=dtype).eval()


@dataclass
class Context:
    """Shared by the items: the device, the two model shapes, the 16-bit dtype, sizes, and what
    earlier items measured (the bandwidth, the models built so far). `rows` belongs to the
    item running now (gpu_check.run_item empties it before each item and keeps it in the
    item's record): an item puts each row there as soon as it is measured, so a record of an
    item stopped at its cap still carries the rows it finished."""

    device: torch.device
    gpu: bool
    small: ModelConfig                 # the embedded model's shape (135M)
    large: ModelConfig                 # SmolLM2-1.7B's shape: memory-bound at batch 1 on a big GPU
    half: torch.dtype                  # bf16 where the GPU has it, else fp16; fp32 on a CPU rehearsal
    new_tokens: int
    batches: tuple[int, ...]
    bandwidth: float | None = None
    models: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)

    @classmethod
    def for_machine(cls, info: dict) -> "Context":
        if info["gpu"]:
            return cls(torch.device("cuda"), True, PRESETS["smollm2-135m"], PRESETS["smollm2-1.7b-shape"],
                       torch.bfloat16 if info.get("bf16") else torch.float16, new_tokens=128,
                       batches=(1, 4, 16, 64, 128, 192, 256, 384, 512))
        tiny = PRESETS["tiny-llama"]
        return cls(torch.device("cpu"), False, tiny, tiny, torch.float32, new_tokens=12, batches=(1, 4, 16))

    def model(self, which: str, dtype: torch.dtype | None = None) -> Transformer:
        """The 'small' or 'large' model in `dtype` (default the 16-bit one), built once."""
        dtype = dtype or self.half
        key = (which, dtype)
        if key not in self.models:
            for old in [k for k in self.models if k[0] == "large" and which == "large"]:
                del self.models[old]                    # one large model on the card at a time
            self.models[key] = random_weights(getattr(self, which), self.device, dtype)
        return self.models[key]

    def free(self) -> None:
        self.models.clear()
        if self.gpu:
            torch.cuda.empty_cache()


@dataclass
class Item:
    """One step of the check: `run(ctx) -> dict`, its kind, its cap on a GPU and in a rehearsal,
    and the least time worth starting it with."""

    name: str
    kind: str                          # "gate" (must pass), "measure" or "info"
    run: Callable[[Context], dict]
    cap_s: float
    rehearsal_cap_s: float = 120
    minimum_s: float = 10


# --- gates ---------------------------------------------------------------------------------

def runtime(ctx: Context) -> dict:
    """What labsupport chooses on this machine (the line every notebook prints)."""
    from labsupport.delivery import describe_runtime
    line = describe_runtime(ctx.device)
    return {"headline": line, "device_name": device_name(ctx.device), "half": dtype_name(ctx.half)}


# --- which SDPA backend ran: from the aten op names ----------------------------------------
#
# F.scaled_dot_product_attention (aten::scaled_dot_product_attention) picks a backend and calls
# that backend's own aten op (torch 2.11, aten/src/ATen/native/transformers/attention.cpp:
# scaled_dot_product_attention, a switch on _fused_sdp_choice). The profiler records every
# dispatcher op by name, so the op under it says which backend ran. Kernel names would not:
# cuDNN's attention kernels have "flash" in their names, and an older version of this check
# called them flash.

SDPA_OPS = (                              # (op name or prefix, backend): the first match wins
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_cudnn_attention_forward", "cudnn"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash (cpu)"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),   # and its _for_* variants not listed above
    ("aten::_flash_attention_forward", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "memory-efficient"),
    ("aten::_efficient_attention_forward", "memory-efficient"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("aten::_scaled_dot_product_attention_math", "math"),      # and _math_for_mps
)
FUSED = ("flash", "memory-efficient", "cudnn", "flash (cpu)")


def sdpa_backend(op_names: list[str]) -> str:
    """The SDPA backend that ran, from the aten op names one call recorded: "cudnn", "flash",
    "flash (cpu)", "memory-efficient", "overrideable", "math", or "unknown" when none of
    `SDPA_OPS` is among them. A pure function (tests/test_gpu_check.py gives it name lists)."""
    for prefix, backend in SDPA_OPS:
        if any(name.startswith(prefix) for name in op_names):
            return backend
    return "unknown"


# the attention shapes the model's steps use: (batch, query positions, key positions, mask)
SDPA_SHAPES = {"prefill, causal, no padding": (1, 128, 128, "causal"),
               "prefill, padded (boolean mask)": (4, 128, 128, "mask"),
               "decode over a fixed-shape cache (boolean mask)": (1, 1, 1024, "mask"),
               "decode, batch 64, no mask": (64, 1, 1024, None)}
CUDNN_ROW = "prefill, causal, no padding"         # the one row also profiled with cuDNN left on


def cudnn_attention(enabled: bool):
    """A context that sets cuDNN attention on or off for SDPA and restores what it was.
    torch 2.11 prefers cuDNN attention on an H100/H200, and cuDNN builds a plan for every new
    shape (tens to hundreds of ms; an eager generation of 128 tokens meets ~128 new shapes):
    the timed items run with it off (run_item in gpu_check.py)."""
    import contextlib

    @contextlib.contextmanager
    def switched():
        before = torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(enabled)
        try:
            yield
        finally:
            torch.backends.cuda.enable_cudnn_sdp(before)
    return switched()


def sdpa_op_names(heads: int, kv_heads: int, head_dim: int, shape: tuple, device: torch.device,
                  dtype: torch.dtype) -> list[str]:
    """The attention op names one SDPA call of `shape` records (CPU activity only: op names are
    recorded on the host, no kernel trace is needed)."""
    from torch.profiler import ProfilerActivity, profile
    batch, T, S, kind = shape
    q = torch.randn(batch, heads, T, head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, S, head_dim, device=device, dtype=dtype) for _ in range(2))
    mask = torch.ones(batch, 1, T, S, dtype=torch.bool, device=device).tril(S - T) if kind == "mask" else None

    def call():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal",
                                                                enable_gqa=kv_heads != heads)
    call()                                        # a first call outside the trace (cuDNN builds its plan)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if "attention" in e.name})


def sdpa_child(request: str) -> None:
    """In a child process: profile each shape of `request` (JSON: the model's heads and the
    device) with cuDNN attention off, and the `CUDNN_ROW` shape once more with it on; print
    the op names as JSON. `sdpa_backends` runs this in a child process so that the profiler
    never runs in the process that times: on CUDA the profiler attaches NVIDIA's CUPTI
    (kineto, libkineto/src/CuptiActivityApi.cpp), and on leaving the profiler kineto only
    disables its activity records; it detaches CUPTI (cuptiFinalize) only when the environment
    says TEARDOWN_CUPTI=1, which torch does not set (torch/profiler/profiler.py sets it to "0"
    with CUDA graphs; pytorch/pytorch issue 144455: launches stay slower after profiling)."""
    import json
    spec = json.loads(request)
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    heads = (spec["heads"], spec["kv_heads"], spec["head_dim"])
    found = {}
    with cudnn_attention(False):
        for label, shape in SDPA_SHAPES.items():
            found[label] = sdpa_op_names(*heads, tuple(shape), device, dtype)
    with cudnn_attention(True):
        found[f"{CUDNN_ROW} (cuDNN left on: torch's default)"] = sdpa_op_names(*heads, SDPA_SHAPES[CUDNN_ROW],
                                                                              device, dtype)
    print(json.dumps(found))


def _sdpa_in_child(ctx: Context, timeout: float) -> dict:
    """`sdpa_child` run in a fresh interpreter; its {label: op names}."""
    import json
    import subprocess
    from pathlib import Path
    config = ctx.small
    request = json.dumps({"device": ctx.device.type, "dtype": dtype_name(ctx.half), "heads": config.num_heads,
                          "kv_heads": config.num_kv_heads, "head_dim": config.head_dim})
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here.parent)!r}, {str(here)!r}]; import gpu_items; "
            f"gpu_items.sdpa_child(sys.argv[1])")
    done = subprocess.run([sys.executable, "-c", code, request], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the SDPA profiling process failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sdpa_backends(ctx: Context) -> dict:
    """The SDPA backend the model's attention gets for each shape it uses, cuDNN attention off
    (as in every timed item), from the op names a profiled call records (in a child process:
    `sdpa_child`); one more row, informational, with cuDNN left on. The gate: a 16-bit prompt
    without padding (the common prefill) gets a fused kernel, not the math path, and no row
    with cuDNN off ran cuDNN."""
    found = _sdpa_in_child(ctx, timeout=120)
    failures = []
    for label, ops in found.items():
        backend = sdpa_backend(ops)
        ctx.rows[label] = {"backend": backend, "ops": ops, "cudnn_enabled": "cuDNN left on" in label}
        if backend == "cudnn" and "cuDNN left on" not in label:
            failures.append(f"{label}: cuDNN ran although it was switched off")
    if ctx.gpu and ctx.rows[CUDNN_ROW]["backend"] not in FUSED:
        failures.append(f"{CUDNN_ROW}: {ctx.rows[CUDNN_ROW]['backend']}, not a fused kernel")
    return {"ok": not failures, "failures": failures,
            "headline": "; ".join(failures) or "; ".join(f"{k}: {v['backend']}" for k, v in ctx.rows.items())}


def compiled_decode(ctx: Context) -> dict:
    """Compiled decoding is the fast path only if it really ran: tokens equal the eager ones
    (fp32, where a different summation order cannot flip a token), the step replays as a CUDA
    graph (no cudagraph skips), and a second shape inside a bucket compiles nothing (two
    buckets, rows 1 and 4, two shapes each: two compiles in all)."""
    model = ctx.model("small", torch.float32)
    shapes = [(PROMPT[:7], 1), (PROMPT, 1), (PROMPT[:9], 3), (PROMPT[:5], 4)]
    failures, seen_buckets = [], set()
    for prompt, batch in shapes:
        prompts = [prompt[: len(prompt) - i % 3] for i in range(batch)] if batch > 1 else prompt
        eager = generate(model, prompts, ctx.new_tokens, eos_token_ids=(), compile=False)
        compiled = generate(model, prompts, ctx.new_tokens, eos_token_ids=(), compile=True)
        same = torch.equal(eager.tokens, compiled.tokens)
        bucket = bucket_rows(batch)
        ctx.rows[f"batch {batch}, prompt {len(prompt)}"] = {
            "batch": batch, "prompt": len(prompt), "rows_bucket": bucket, "same_tokens": same,
            "path": compiled.decode_path, "warmup_s": round(compiled.warmup_seconds, 2),
            "compiles": compiled.compiles, "cudagraph_skips": compiled.cudagraph_skips, "note": compiled.decode_note}
        if not same:
            failures.append(f"batch {batch}: compiled tokens differ from eager")
        if compiled.decode_path != expected_path(ctx):
            failures.append(f"batch {batch}: the step ran {compiled.decode_path!r}, not {expected_path(ctx)!r} "
                            f"({compiled.decode_note})")
        if compiled.cudagraph_skips:
            failures.append(f"batch {batch}: torch skipped {compiled.cudagraph_skips} CUDA graph(s)")
        if bucket in seen_buckets and compiled.compiles:
            failures.append(f"batch {batch}: compiled {compiled.compiles} graph(s) again inside a bucket already warm")
        seen_buckets.add(bucket)
    rows = ctx.rows.values()
    compiles = sum(r["compiles"] for r in rows)
    return {"ok": not failures, "failures": failures, "compiles": compiles,
            "headline": ("; ".join(failures) if failures else
                         f"{len(rows)} shapes in {len(seen_buckets)} buckets: same tokens as eager, "
                         f"paths {sorted({r['path'] for r in rows})}, {compiles} graphs compiled")}


def expected_path(ctx: Context) -> str:
    """The decode path a compiled generation must report: with CUDA graphs on a GPU, compiled
    (inductor's CPU code, no graphs) in a CPU rehearsal."""
    return CUDA_GRAPHS if ctx.gpu else COMPILED


def quant_kernels(ctx: Context) -> dict:
    """The fast int4 (tinygemm on CUDA 8.0+) and int8 kernels are chosen where the device has
    them, and each layer's error against its own dequantized weight is float rounding only."""
    n, k = (2048, 2048) if ctx.gpu else (256, 256)
    linear = torch.nn.Linear(k, n, bias=False).to(ctx.device)
    x = torch.randn(8, k, device=ctx.device)
    rows, failures = ctx.rows, []
    for name, build in (("int4 g32", lambda: Int4Linear.from_linear(linear, group_size=32, warn=False)),
                        ("int8", lambda: Int8Linear.from_linear(linear, warn=False))):
        layer = build()
        with torch.no_grad():
            reference = x @ layer.dequantized_weight().to(x.device, x.dtype).T
            error = ((layer(x) - reference).norm() / reference.norm()).item()
        described = kernel_description(layer)
        expected_fast = name.startswith("int8") or int4_kernel_unavailable(ctx.device, 32, k) is None
        rows[name] = {"kernel": described, "relative_error": error, "fast_expected": expected_fast}
        if expected_fast and described.startswith("reference"):
            failures.append(f"{name}: the fast kernel was expected and not chosen ({described})")
        if error > 0.02:
            failures.append(f"{name}: error {error:.3g} against its own dequantized weight")
    return {"ok": not failures, "failures": failures,
            "headline": "; ".join(failures) or "; ".join(f"{k}: {v['kernel']} (error {v['relative_error']:.1e})"
                                                        for k, v in rows.items())}


# --- measurements --------------------------------------------------------------------------

# The GPUs this check is lent, by a part of the name torch reports (an H100 SXM says "NVIDIA H100
# 80GB HBM3"), and their data sheet in notebook 00's table (`lab.roofline_hardware.DATA_SHEETS`,
# the one home of those figures): (part, what to call it, the sheet's name). Other GPUs (a PCIe or
# NVL H100 among them: other figures) get none here, and the check says so.
DATA_SHEET_HBM = (("H200", "H200", "NVIDIA H200 SXM"), ("H100 80GB HBM3", "H100 SXM", "NVIDIA H100 SXM"),
                  ("H100 SXM", "H100 SXM", "NVIDIA H100 SXM"))


def data_sheet(ctx: Context) -> tuple[str, float] | None:
    """(the GPU's name on its data sheet, its HBM bandwidth in bytes/s) where `DATA_SHEET_HBM` has
    this device's name, else None (every other GPU, and a CPU rehearsal)."""
    from labsupport.lab.roofline_hardware import DATA_SHEETS
    name = device_name(ctx.device)
    bandwidth = {sheet.name: sheet.bandwidth for sheet in DATA_SHEETS}
    return next(((label, bandwidth[sheet]) for part, label, sheet in DATA_SHEET_HBM if part in name), None)


def data_sheet_text(ctx: Context) -> str:
    """The data sheet a headline's fractions are of, or that there is none, in a few words."""
    sheet = data_sheet(ctx)
    return (f"data sheet: {sheet[0]} HBM {sheet[1] / 1e12:.2f} TB/s" if sheet else
            f"no data sheet figure for {device_name(ctx.device)}")


def bandwidth(ctx: Context) -> dict:
    """Copy bandwidth, CUDA events, 4 GiB buffers where they fit (`lab.roofs.copy_timing`), and its
    fraction of the data sheet's HBM bandwidth (`data_sheet`)."""
    from labsupport.lab.roofs import copy_bandwidth, copy_timing
    nbytes, timing = copy_timing(ctx.device)
    ctx.bandwidth = copy_bandwidth(nbytes, timing.median)
    sheet = data_sheet(ctx)
    ctx.rows["copy"] = {"bytes": nbytes, "bandwidth_bytes_per_s": ctx.bandwidth,
                        "spread": timing.spread / timing.median,
                        "fraction_of_data_sheet": ctx.bandwidth / sheet[1] if sheet else None}
    of_sheet = f"{ctx.bandwidth / sheet[1]:.0%} of the " if sheet else ""
    return {"headline": f"{ctx.bandwidth / 1e9:.0f} GB/s copying {nbytes / 2**30:.1f} GiB "
                        f"({of_sheet}{data_sheet_text(ctx)})"}


def decode_row(ctx: Context, model, compile: bool, repeats: int = 3) -> dict:
    """Batch-1 decode of `model`: tokens/s, the median of `repeats` warm runs, and what ran. The
    first run compiles and records (on a GPU) and is not timed: its seconds are kept apart
    (``warmup_s``: compiling and recording; ``first_run_s``: that whole run) from the timed
    runs' decode seconds (``timed_s``). A compiled row is ok only on `expected_path`, with no
    cudagraph skip and nothing compiled during the timed runs; ``note`` says why not."""
    start = time.perf_counter()
    first = generate(model, PROMPT, ctx.new_tokens, eos_token_ids=(), compile=compile)
    first_s = time.perf_counter() - start
    runs = [generate(model, PROMPT, ctx.new_tokens, eos_token_ids=(), compile=compile) for _ in range(repeats)]
    rate = statistics.median(r.decode_tokens_per_s for r in runs)
    row = {"tokens_per_s": rate, "path": runs[-1].decode_path, "compiles": first.compiles,
           "timed_compiles": sum(r.compiles for r in runs),
           "cudagraph_skips": first.cudagraph_skips + sum(r.cudagraph_skips for r in runs),
           "warmup_s": round(first.warmup_seconds, 2), "first_run_s": round(first_s, 2),
           "timed_s": round(sum(r.decode_seconds for r in runs), 3),
           "fraction_of_bandwidth": _fraction(ctx, model, rate),
           "fraction_of_data_sheet": _fraction(ctx, model, rate, of_data_sheet=True),
           "ok": True, "note": first.decode_note}
    if compile:
        row["ok"], row["note"] = _path_verdict(ctx, row, first.decode_note)
    return row


def _path_verdict(ctx: Context, row: dict, note: str | None) -> tuple[bool, str | None]:
    """(ok, note) for a compiled row: the expected path, no cudagraph skip, no compile while timed."""
    problems = []
    if row["path"] != expected_path(ctx):
        problems.append(f"ran {row['path']!r}, not {expected_path(ctx)!r}" + (f" ({note})" if note else ""))
    if row["cudagraph_skips"]:
        problems.append(f"torch skipped {row['cudagraph_skips']} CUDA graph(s)")
    if row["timed_compiles"]:
        problems.append(f"{row['timed_compiles']} graph(s) compiled during the timed runs")
    return not problems, "; ".join(problems) or note


def _fraction(ctx: Context, model, rate: float, batch: int = 1, of_data_sheet: bool = False) -> float | None:
    """Fraction of the copy bandwidth (of_data_sheet: of the data sheet's HBM bandwidth, `data_sheet`)
    a decode at `rate` tokens/s reaches: (weights + cache read per step) x steps per second / bandwidth."""
    sheet = data_sheet(ctx)
    bandwidth = (sheet[1] if sheet else None) if of_data_sheet else ctx.bandwidth
    if not bandwidth:
        return None
    step_bytes = model.weight_bytes() + kv_cache_bytes(model.config, len(PROMPT) + ctx.new_tokens // 2, batch,
                                                       model.dtype)
    return step_bytes * rate / batch / bandwidth


def _rate_text(label: str, row: dict) -> str:
    if row.get("status") == "skipped":
        return f"{label}: skipped ({row['reason']})"
    if row.get("tokens_per_s") is None:
        return f"{label}: FAILED: {row['note']}"
    fraction = f", {row['fraction_of_bandwidth']:.0%} of copy bandwidth" if row["fraction_of_bandwidth"] else ""
    if row.get("fraction_of_data_sheet"):
        fraction += f", {row['fraction_of_data_sheet']:.0%} of the data sheet's"
    failed = "" if row["ok"] else f" FAILED: {row['note']}"
    return f"{label}: {row['tokens_per_s']:.0f} tok/s ({row['path']}{fraction}){failed}"


def decode_bs1(ctx: Context) -> dict:
    """Batch-1 decode, eager against compiled + CUDA graphs, on both shapes, in 16 bits; and the
    large shape's step replayed from one `torch.cuda.CUDAGraph` (`manual_graph_row`)."""
    for which in ("small", "large"):
        model = ctx.model(which)
        for compile in (False, True):
            label = f"{which} ({getattr(ctx, which).name}) {'compiled' if compile else 'eager'}"
            ctx.rows[label] = decode_row(ctx, model, compile)
    names = list(ctx.rows)
    speedups = {names[i + 1]: ctx.rows[names[i + 1]]["tokens_per_s"] / ctx.rows[names[i]]["tokens_per_s"]
                for i in (0, 2)}
    manual = ctx.rows[f"large ({ctx.large.name}) {MANUAL_GRAPH}"] = manual_graph_row(ctx, ctx.model("large"))
    trees = ctx.rows[names[3]]["tokens_per_s"]
    return {"ok": all(r["ok"] for r in ctx.rows.values()), "compiled_over_eager": speedups,
            "trees_step_over_manual_graph_step": manual["tokens_per_s"] / trees if manual.get("tokens_per_s") else None,
            "headline": "; ".join([*(_rate_text(k, v) for k, v in ctx.rows.items()), data_sheet_text(ctx)])}


MANUAL_GRAPH = "torch.cuda.CUDAGraph step"


def manual_graph_row(ctx: Context, model) -> dict:
    """Batch-1 decode steps of `model` replayed from one `torch.cuda.CUDAGraph`, no cudagraph trees:
    the fixed-shape step the compiled decoder compiles, run eagerly and captured once at the decode
    rows' mean context (`step_timing.graphed_decode_seconds`, as the batching knee times it). Set
    beside the compiled + CUDA graphs row, it tells a slowdown of cudagraph trees' replays (upstream:
    pytorch#174575) from one of our step (its kernels) or our loop (its host work per token, which
    this row has none of). A CPU rehearsal has no CUDA graph: the row is skipped and says why."""
    from labsupport.errors import LabError
    from labsupport.lab.step_timing import graphed_decode_seconds
    if not ctx.gpu:
        return {"status": "skipped", "ok": True, "path": MANUAL_GRAPH,
                "reason": "torch.cuda.CUDAGraph captures CUDA work only, and this rehearsal runs on the CPU"}
    context = len(PROMPT) + ctx.new_tokens // 2
    try:
        seconds = graphed_decode_seconds(model, 1, context)
    except LabError as error:
        return {"ok": False, "path": MANUAL_GRAPH, "note": str(error), "tokens_per_s": None}
    rate = 1 / seconds
    return {"tokens_per_s": rate, "step_s": seconds, "context": context, "path": MANUAL_GRAPH, "ok": True,
            "note": None, "fraction_of_bandwidth": _fraction(ctx, model, rate),
            "fraction_of_data_sheet": _fraction(ctx, model, rate, of_data_sheet=True)}


def quant_decode(ctx: Context) -> dict:
    """int4 and int8 against 16 bits on the large shape, batch 1, every row compiled (like with
    like), and every row must be on the expected path (CUDA graphs on a GPU)."""
    import copy
    base = ctx.model("large")
    for name in ("16-bit", "int8", "int4 g32"):
        model = base if name == "16-bit" else copy.deepcopy(base)
        if name != "16-bit":
            quantize_model(model, "int8" if name == "int8" else "int4", group_size=32)
        row = decode_row(ctx, model, compile=True)
        row["kernel"] = kernel_description(model.blocks[0].mlp.down if hasattr(model.blocks[0].mlp, "down")
                                           else model.blocks[0].attn.out)
        ctx.rows[name] = row
        if model is not base:
            del model
            if ctx.gpu:
                torch.cuda.empty_cache()
    ref = ctx.rows["16-bit"]["tokens_per_s"]
    return {"ok": all(r["ok"] for r in ctx.rows.values()),
            "over_16_bit": {k: v["tokens_per_s"] / ref for k, v in ctx.rows.items()},
            "headline": "; ".join([*(_rate_text(k, v) + f" {v['tokens_per_s'] / ref:.2f}x"
                                     for k, v in ctx.rows.items()), data_sheet_text(ctx)])}


# The batching knee's context. SmolLM2-1.7B has no grouped-query attention: 24 layers x 32
# key-value heads x 64 x 2 (keys, values) x 2 bytes = 192 KiB of cache per position per row,
# read at every step. Past about 70-105 positions (`roofline.ridge_context` for an H100 or
# H200's measured roofs) each row adds more cache bytes than its FLOPs can pay for, so no
# batch reaches the ridge; at 16 positions the predicted ridge is near batch 200-300.
KNEE_CONTEXT = 16


def batching_knee(ctx: Context) -> dict:
    """Decode-step time against the batch on the large shape at a short context, each step
    replayed as a CUDA graph (eager launches would hide the knee under their own cost), each
    against its roofline time (max(weight and cache bytes / the copy bandwidth measured by
    `bandwidth`, FLOPs / the 16-bit matmul peak measured here)), and the measured knee
    against the predicted ridge."""
    from labsupport.lab.roofline import decode_step_cost, growth_batch, ridge_batch, ridge_context
    from labsupport.lab.roofs import HardwareProfile, measure_matmul_flops
    from labsupport.lab.step_timing import graphed_decode_seconds
    model = ctx.model("large")
    flops = measure_matmul_flops(ctx.device, ctx.half)
    bandwidth = ctx.bandwidth or measure_bandwidth_now(ctx)
    profile = HardwareProfile(ctx.device.type, device_name(ctx.device), bandwidth, {dtype_name(ctx.half): flops})
    for batch in ctx.batches:
        seconds = graphed_decode_seconds(model, batch, context=KNEE_CONTEXT)
        # the step writes one position and attends over KNEE_CONTEXT + 1
        cost = decode_step_cost(model.config, batch, KNEE_CONTEXT + 1, ctx.half)
        memory_s, compute_s = cost.bytes / bandwidth, cost.flops / flops
        roofline = max(memory_s, compute_s)
        ctx.rows[f"batch {batch}"] = {"batch": batch, "seconds": seconds, "tokens_per_s": batch / seconds,
                                      "roofline_s": roofline, "measured_over_roofline": seconds / roofline,
                                      "bound": "memory" if memory_s >= compute_s else "compute",
                                      "weight_bytes": cost.weight_bytes, "kv_bytes": cost.kv_bytes,
                                      "flops": cost.flops}
    rows = list(ctx.rows.values())
    predicted = ridge_batch(profile, model.config, ctx.half, context=KNEE_CONTEXT + 1)
    knee = growth_batch(rows)
    ratios = ", ".join(f"{r['batch']}: {r['measured_over_roofline']:.1f}x" for r in rows)
    return {"context": KNEE_CONTEXT, "matmul_flops": flops, "bandwidth": bandwidth,
            "predicted_ridge_batch": predicted, "measured_knee_batch": knee,
            "no_ridge_past_context": ridge_context(profile, model.config, ctx.half),
            "headline": f"context {KNEE_CONTEXT}: predicted ridge at batch {predicted:.0f}, step time 1.5x "
                        f"batch 1's at batch {knee}; measured / roofline per batch {ratios}"}


def measure_bandwidth_now(ctx: Context) -> float:
    """The copy bandwidth, measured here when the `bandwidth` item did not run (--only)."""
    from labsupport.lab.roofs import measure_bandwidth
    ctx.bandwidth = measure_bandwidth(ctx.device)
    return ctx.bandwidth


def serving(ctx: Context) -> dict:
    """Continuous against static batching in the serving engine, on the small shape in 16 bits,
    and ``ok`` only if it ran as it must: on a GPU each engine replays its decode steps as CUDA
    graphs (`serving_path`; in a CPU rehearsal, eager), and the graphed tokens equal the same
    engine's eager tokens in fp32 (`_graphed_tokens_in_fp32`: in 16 bits, random weights round
    by more than the gap between their top two logits, so equal tokens proved nothing there and
    unequal ones nothing wrong)."""
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_metrics import summarize
    from labsupport.lab.serving_workload import make_workload
    model = ctx.model("small")
    prompts = [PROMPT[: 4 + i % 8] for i in range(8)]
    count, slots = (48, 16) if ctx.gpu else (8, 4)
    requests = make_workload(prompts, count=count, median_new_tokens=32 if ctx.gpu else 6,
                             max_new_tokens=128 if ctx.gpu else 12, seed=0)
    rows, failures = ctx.rows, []
    for policy in ("static", "continuous"):
        engine = Engine(model, max_slots=slots, policy=policy)
        result = engine.run(requests)
        engine.blocks.assert_no_leaks()
        m = summarize(result)
        rows[policy] = {"throughput": m["throughput_tokens_per_s"], "ttft_p50": m["ttft_p50"], "duration": m["duration"],
                        "decode_path": result.decode_path, "decode_note": result.decode_note,
                        "graphs": engine.graphs.captured if engine.graphs else 0,
                        "capture_s": engine.graphs.capture_seconds if engine.graphs else 0.0}
        failures += _serving_path_failures(ctx, policy, result)
    ratio = rows["continuous"]["throughput"] / rows["static"]["throughput"]
    paths = sorted({rows[p]["decode_path"] for p in ("static", "continuous")})
    same = ""
    if ctx.gpu:
        failures += _graphed_tokens_in_fp32(ctx, Engine, requests, slots)
        matching, total = rows["fp32_graphed_same_tokens_as_eager"]
        same = f"; fp32 graphed tokens = eager for {matching}/{total} requests"
    return {"ok": not failures, "failures": failures, "continuous_over_static": ratio,
            "headline": "; ".join(failures) or (f"continuous / static throughput {ratio:.2f}x ({count} requests; "
                                                f"decode: {', '.join(paths)}{same})")}


def serving_path(ctx: Context) -> str:
    """The decode path a serving engine must report: its CUDA graphs on a GPU, eager in a CPU
    rehearsal (the engine captures graphs only on CUDA)."""
    from labsupport.engine.serving.decode_graphs import EAGER, GRAPHED
    return GRAPHED if ctx.gpu else EAGER


def _serving_path_failures(ctx: Context, what: str, result) -> list[str]:
    """[a sentence] when `result`'s decode steps did not run on `serving_path`, else []."""
    if result.decode_path == serving_path(ctx):
        return []
    note = f" ({result.decode_note})" if result.decode_note else ""
    return [f"{what}: the engine's decode steps ran {result.decode_path!r}, not {serving_path(ctx)!r}{note}"]


def _graphed_tokens_in_fp32(ctx: Context, engine_class, requests, slots: int) -> list[str]:
    """The continuous engine on the small shape in fp32, graphed and eager, on the same requests:
    [a sentence] for a graphed run not on the graphed path or for requests whose tokens differ."""
    model = ctx.model("small", torch.float32)
    graphed = engine_class(model, max_slots=slots, policy="continuous").run(requests)
    eager = engine_class(model, max_slots=slots, policy="continuous", cuda_graphs=False).run(requests).tokens()
    tokens = graphed.tokens()
    matching = sum(tokens.get(i) == t for i, t in eager.items())
    ctx.rows["fp32_graphed_same_tokens_as_eager"] = [matching, len(eager)]
    failures = _serving_path_failures(ctx, "fp32 graphed run", graphed)
    if matching != len(eager):
        failures.append(f"fp32: the graphed engine's tokens differ from the eager engine's for "
                        f"{len(eager) - matching} of {len(eager)} requests")
    return failures


def vllm(ctx: Context) -> dict:
    """vLLM's row, only where it imports (this check never installs it)."""
    try:
        import vllm as vllm_module                               # noqa: F401
    except ImportError as error:
        return {"status": "skipped", "headline": f"vLLM is not installed here ({type(error).__name__})"}
    return {"status": "skipped", "version": getattr(vllm_module, "__version__", "?"),
            "headline": "vLLM imports; its serving row runs in the bench's serving section (not in this short check)"}


# Caps and minimums in seconds, sized for gpu_check.DEFAULT_BUDGET (420 s from the process's
# start): the minimums of all items together, with the start-up, fit in it with room
# (tests/test_gpu_check.py checks that); a cap is the most an item may take on a GPU, and
# gpu_check gives an item less when the items after it would lose their minimums.
ITEMS = [
    Item("runtime", "info", runtime, cap_s=20, rehearsal_cap_s=30, minimum_s=2),
    Item("sdpa_backends", "gate", sdpa_backends, cap_s=60, rehearsal_cap_s=60, minimum_s=20),
    Item("compiled_decode", "gate", compiled_decode, cap_s=150, rehearsal_cap_s=240, minimum_s=60),
    Item("quant_kernels", "gate", quant_kernels, cap_s=30, rehearsal_cap_s=30, minimum_s=5),
    Item("bandwidth", "measure", bandwidth, cap_s=20, rehearsal_cap_s=20, minimum_s=5),
    Item("decode_bs1", "measure", decode_bs1, cap_s=120, rehearsal_cap_s=240, minimum_s=40),
    Item("quant_decode", "measure", quant_decode, cap_s=150, rehearsal_cap_s=240, minimum_s=60),
    Item("batching_knee", "measure", batching_knee, cap_s=60, rehearsal_cap_s=60, minimum_s=20),
    Item("serving", "measure", serving, cap_s=60, rehearsal_cap_s=60, minimum_s=15),
    Item("vllm", "measure", vllm, cap_s=10, rehearsal_cap_s=10, minimum_s=1),
]
