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
from dataclasses import dataclass, field
from typing import Callable

import torch

from labsupport.engine.compiled import CUDA_GRAPHS, bucket_rows
from labsupport.engine.generation import generate
from labsupport.engine.hardware import bf16_supported, device_name, dtype_name
from labsupport.engine.kv_cache import kv_cache_bytes
from labsupport.engine.models.config import PRESETS, ModelConfig
from labsupport.engine.models.transformer import Transformer
from labsupport.engine.quant import quantize_model
from labsupport.engine.quant.kernels import Int4Linear, Int8Linear, int4_kernel_unavailable, kernel_description

PROMPT = [1, 42, 217, 31, 253, 145, 28, 155, 82, 253, 235, 135]     # 12 ids inside every vocabulary here (tiny: 260)


# --- the machine and the models ------------------------------------------------------------

def machine() -> dict:
    """What torch sees: versions, the GPU's name, capability and memory (no labsupport choice yet)."""
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.is_available()}
    if info["gpu"]:
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2**30, 1), count=torch.cuda.device_count(),
                    bf16=bf16_supported(torch.device("cuda")))
    return info


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
    earlier items measured (the bandwidth, the models built so far)."""

    device: torch.device
    gpu: bool
    small: ModelConfig                 # the embedded model's shape (135M)
    large: ModelConfig                 # SmolLM2-1.7B's shape: memory-bound at batch 1 on a big GPU
    half: torch.dtype                  # bf16 where the GPU has it, else fp16; fp32 on a CPU rehearsal
    new_tokens: int
    batches: tuple[int, ...]
    bandwidth: float | None = None
    models: dict = field(default_factory=dict)

    @classmethod
    def for_machine(cls, info: dict) -> "Context":
        if info["gpu"]:
            return cls(torch.device("cuda"), True, PRESETS["smollm2-135m"], PRESETS["smollm2-1.7b-shape"],
                       torch.bfloat16 if info.get("bf16") else torch.float16, new_tokens=128,
                       batches=(1, 4, 16, 64, 128, 256, 512))
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


def _sdpa_kernels(fn) -> list[str]:
    """The names of the device kernels one call of `fn` launched (the profiler's events)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return sorted({e.name for e in prof.events()
                   if (e.device_type.name.lower() == wanted) and ("attention" in e.name.lower() or "fmha"
                       in e.name.lower() or "flash" in e.name.lower() or "softmax" in e.name.lower())})


def backend_of(kernels: list[str]) -> str:
    """flash / efficient / cudnn / math (a softmax kernel and no fused one), from kernel names."""
    text = " ".join(kernels).lower()
    for name, marks in (("flash", ("flash",)), ("cudnn", ("cudnn",)), ("efficient", ("fmha", "efficient", "mem_eff")),
                        ("math", ("softmax",))):
        if any(m in text for m in marks):
            return name
    return "unknown"


def sdpa_backends(ctx: Context) -> dict:
    """The SDPA backend the model's attention gets for each shape it uses. The gate: a 16-bit
    prompt without padding (the common prefill) must get a fused kernel, not the math path."""
    model = ctx.model("small")
    heads, kv, dim = model.config.num_heads, model.config.num_kv_heads, model.config.head_dim
    shapes = {"prefill, causal, no padding": (1, 128, 128, "causal"),
              "prefill, padded (boolean mask)": (4, 128, 128, "mask"),
              "decode over a fixed-shape cache (boolean mask)": (1, 1, 1024, "mask"),
              "decode, batch 64, no mask": (64, 1, 1024, None)}
    found = {}
    for label, (batch, T, S, kind) in shapes.items():
        q = torch.randn(batch, heads, T, dim, device=ctx.device, dtype=ctx.half)
        k, v = (torch.randn(batch, kv, S, dim, device=ctx.device, dtype=ctx.half) for _ in range(2))
        mask = torch.ones(batch, 1, T, S, dtype=torch.bool, device=ctx.device).tril(S - T) if kind == "mask" else None
        call = lambda: torch.nn.functional.scaled_dot_product_attention(      # noqa: E731
            q, k, v, attn_mask=mask, is_causal=kind == "causal", enable_gqa=kv != heads)
        kernels = _sdpa_kernels(call)
        found[label] = {"backend": backend_of(kernels), "kernels": kernels[:6]}
    fused = found["prefill, causal, no padding"]["backend"] not in ("math", "unknown")
    ok = fused or not ctx.gpu
    return {"ok": ok, "backends": found,
            "headline": "; ".join(f"{k}: {v['backend']}" for k, v in found.items())}


def compiled_decode(ctx: Context) -> dict:
    """Compiled decoding is the fast path only if it really ran: tokens equal the eager ones
    (fp32, where a different summation order cannot flip a token), the step replays as a CUDA
    graph (no cudagraph skips), and a second shape inside a bucket compiles nothing (two
    buckets, rows 1 and 4, two shapes each: two compiles in all)."""
    model = ctx.model("small", torch.float32)
    shapes = [(PROMPT[:7], 1), (PROMPT, 1), (PROMPT[:9], 3), (PROMPT[:5], 4)]
    rows, failures, seen_buckets = [], [], set()
    for prompt, batch in shapes:
        prompts = [prompt[: len(prompt) - i % 3] for i in range(batch)] if batch > 1 else prompt
        eager = generate(model, prompts, ctx.new_tokens, eos_token_ids=(), compile=False)
        compiled = generate(model, prompts, ctx.new_tokens, eos_token_ids=(), compile=True)
        same = torch.equal(eager.tokens, compiled.tokens)
        bucket = bucket_rows(batch)
        row = {"batch": batch, "prompt": len(prompt), "rows_bucket": bucket, "same_tokens": same,
               "path": compiled.decode_path, "warmup_s": round(compiled.warmup_seconds, 2),
               "compiles": compiled.compiles, "cudagraph_skips": compiled.cudagraph_skips,
               "note": compiled.decode_note}
        rows.append(row)
        if not same:
            failures.append(f"batch {batch}: compiled tokens differ from eager")
        if compiled.decode_path == "eager":
            failures.append(f"batch {batch}: compiling did not happen ({compiled.decode_note})")
        elif ctx.gpu and compiled.decode_path != CUDA_GRAPHS:
            failures.append(f"batch {batch}: the step did not replay as a CUDA graph ({compiled.decode_note})")
        if compiled.cudagraph_skips:
            failures.append(f"batch {batch}: torch skipped {compiled.cudagraph_skips} CUDA graph(s)")
        if bucket in seen_buckets and compiled.compiles:
            failures.append(f"batch {batch}: compiled {compiled.compiles} graph(s) again inside a bucket already warm")
        seen_buckets.add(bucket)
    compiles = sum(r["compiles"] for r in rows)
    return {"ok": not failures, "rows": rows, "failures": failures, "compiles": compiles,
            "headline": ("; ".join(failures) if failures else
                         f"{len(rows)} shapes in {len(seen_buckets)} buckets: same tokens as eager, "
                         f"paths {sorted({r['path'] for r in rows})}, {compiles} graphs compiled")}


def quant_kernels(ctx: Context) -> dict:
    """The fast int4 (tinygemm on CUDA 8.0+) and int8 kernels are chosen where the device has
    them, and each layer's error against its own dequantized weight is float rounding only."""
    n, k = (2048, 2048) if ctx.gpu else (256, 256)
    linear = torch.nn.Linear(k, n, bias=False).to(ctx.device)
    x = torch.randn(8, k, device=ctx.device)
    rows, failures = {}, []
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
    return {"ok": not failures, "layers": rows, "failures": failures,
            "headline": "; ".join(failures) or "; ".join(f"{k}: {v['kernel']} (error {v['relative_error']:.1e})"
                                                        for k, v in rows.items())}


# --- measurements --------------------------------------------------------------------------

def bandwidth(ctx: Context) -> dict:
    """Copy bandwidth, CUDA events, 4 GiB buffers where they fit (`lab.roofs.copy_timing`)."""
    from labsupport.lab.roofs import copy_bandwidth, copy_timing
    nbytes, timing = copy_timing(ctx.device)
    ctx.bandwidth = copy_bandwidth(nbytes, timing.median)
    return {"bytes": nbytes, "bandwidth_bytes_per_s": ctx.bandwidth, "spread": timing.spread / timing.median,
            "headline": f"{ctx.bandwidth / 1e9:.0f} GB/s copying {nbytes / 2**30:.1f} GiB"}


def _decode_rate(model, batch: int, new_tokens: int, compile: bool, repeats: int = 3) -> dict:
    """Median decode tokens/s of `repeats` warm runs (the first, warming run is not counted)."""
    prompts = [PROMPT] * batch if batch > 1 else PROMPT
    first = generate(model, prompts, new_tokens, eos_token_ids=(), compile=compile)
    runs = [generate(model, prompts, new_tokens, eos_token_ids=(), compile=compile) for _ in range(repeats)]
    rate = statistics.median(r.decode_tokens_per_s for r in runs)
    return {"tokens_per_s": rate, "path": runs[-1].decode_path, "warmup_s": round(first.warmup_seconds, 2)}


def _fraction(ctx: Context, model, rate: float, batch: int = 1) -> float | None:
    """Fraction of the copy bandwidth a decode at `rate` tokens/s reaches: (weights + cache read
    per step) x steps per second / bandwidth."""
    if not ctx.bandwidth:
        return None
    step_bytes = model.weight_bytes() + kv_cache_bytes(model.config, len(PROMPT) + ctx.new_tokens // 2, batch,
                                                       model.dtype)
    return step_bytes * rate / batch / ctx.bandwidth


def decode_bs1(ctx: Context) -> dict:
    """Batch-1 decode, eager against compiled + CUDA graphs, on both shapes, in 16 bits."""
    rows = {}
    for which in ("small", "large"):
        model = ctx.model(which)
        for compile in (False, True):
            r = _decode_rate(model, 1, ctx.new_tokens, compile)
            r["fraction_of_bandwidth"] = _fraction(ctx, model, r["tokens_per_s"])
            rows[f"{which} ({getattr(ctx, which).name}) {'compiled' if compile else 'eager'}"] = r
    names = list(rows)
    speedups = {names[i + 1]: rows[names[i + 1]]["tokens_per_s"] / rows[names[i]]["tokens_per_s"] for i in (0, 2)}
    return {"rows": rows, "compiled_over_eager": speedups,
            "headline": "; ".join(f"{k}: {v['tokens_per_s']:.0f} tok/s ({v['path']}"
                                  + (f", {v['fraction_of_bandwidth']:.0%} of copy bandwidth)" if v["fraction_of_bandwidth"]
                                     else ")") for k, v in rows.items())}


def quant_decode(ctx: Context) -> dict:
    """int4 and int8 against 16 bits on the large shape, batch 1, every row compiled (like with like)."""
    import copy
    rows = {}
    base = ctx.model("large")
    for name in ("16-bit", "int8", "int4 g32"):
        model = base if name == "16-bit" else copy.deepcopy(base)
        if name != "16-bit":
            quantize_model(model, "int8" if name == "int8" else "int4", group_size=32)
        r = _decode_rate(model, 1, ctx.new_tokens, compile=True)
        r["kernel"] = kernel_description(model.blocks[0].mlp.down if hasattr(model.blocks[0].mlp, "down")
                                         else model.blocks[0].attn.out)
        r["fraction_of_bandwidth"] = _fraction(ctx, model, r["tokens_per_s"])
        rows[name] = r
        if model is not base:
            del model
            if ctx.gpu:
                torch.cuda.empty_cache()
    ref = rows["16-bit"]["tokens_per_s"]
    return {"rows": rows, "over_16_bit": {k: v["tokens_per_s"] / ref for k, v in rows.items()},
            "headline": "; ".join(f"{k}: {v['tokens_per_s']:.0f} tok/s ({v['tokens_per_s'] / ref:.2f}x, {v['path']})"
                                  for k, v in rows.items())}


def batching_knee(ctx: Context) -> dict:
    """Decode-step time against the batch on the large shape, each step replayed as a CUDA graph
    (eager launches would hide the knee under their own cost), against the ridge predicted from
    this machine's bandwidth and 16-bit matmul speed."""
    from labsupport.lab.roofline import growth_batch, ridge_batch
    from labsupport.lab.roofs import HardwareProfile, measure_matmul_flops
    from labsupport.lab.step_timing import graphed_decode_seconds
    model = ctx.model("large")
    rows = []
    for batch in ctx.batches:
        seconds = graphed_decode_seconds(model, batch, context=128)
        rows.append({"batch": batch, "seconds": seconds, "tokens_per_s": batch / seconds})
    flops = measure_matmul_flops(ctx.device, ctx.half)
    profile = HardwareProfile(ctx.device.type, device_name(ctx.device), ctx.bandwidth or 1.0,
                              {dtype_name(ctx.half): flops})
    predicted = ridge_batch(profile, model.config, ctx.half, context=128)
    knee = growth_batch(rows)
    return {"rows": rows, "matmul_flops": flops, "predicted_ridge_batch": predicted, "measured_knee_batch": knee,
            "headline": f"predicted ridge at batch {predicted:.0f}, step time 1.5x batch 1's at batch {knee}"}


def serving(ctx: Context) -> dict:
    """Continuous against static batching in the serving engine, both eager, on the small shape."""
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_metrics import summarize
    from labsupport.lab.serving_workload import make_workload
    model = ctx.model("small")
    prompts = [PROMPT[: 4 + i % 8] for i in range(8)]
    count = 48 if ctx.gpu else 8
    requests = make_workload(prompts, count=count, median_new_tokens=32 if ctx.gpu else 6,
                             max_new_tokens=128 if ctx.gpu else 12, seed=0)
    rows = {}
    for policy in ("static", "continuous"):
        engine = Engine(model, max_slots=16 if ctx.gpu else 4, policy=policy)
        result = engine.run(requests)
        engine.blocks.assert_no_leaks()
        m = summarize(result)
        rows[policy] = {"throughput": m["throughput_tokens_per_s"], "ttft_p50": m["ttft_p50"], "duration": m["duration"]}
    ratio = rows["continuous"]["throughput"] / rows["static"]["throughput"]
    return {"rows": rows, "continuous_over_static": ratio,
            "headline": f"continuous / static throughput {ratio:.2f}x ({count} requests, both eager)"}


def vllm(ctx: Context) -> dict:
    """vLLM's row, only where it imports (this check never installs it)."""
    try:
        import vllm as vllm_module                               # noqa: F401
    except ImportError as error:
        return {"status": "skipped", "headline": f"vLLM is not installed here ({type(error).__name__})"}
    return {"status": "skipped", "version": getattr(vllm_module, "__version__", "?"),
            "headline": "vLLM imports; its serving row runs in the bench's serving section (not in this short check)"}


ITEMS = [
    Item("runtime", "info", runtime, cap_s=30, rehearsal_cap_s=30, minimum_s=2),
    Item("sdpa_backends", "gate", sdpa_backends, cap_s=40, rehearsal_cap_s=30),
    Item("compiled_decode", "gate", compiled_decode, cap_s=150, rehearsal_cap_s=240, minimum_s=60),
    Item("quant_kernels", "gate", quant_kernels, cap_s=40, rehearsal_cap_s=30),
    Item("bandwidth", "measure", bandwidth, cap_s=20, rehearsal_cap_s=20, minimum_s=5),
    Item("decode_bs1", "measure", decode_bs1, cap_s=120, rehearsal_cap_s=240, minimum_s=40),
    Item("quant_decode", "measure", quant_decode, cap_s=150, rehearsal_cap_s=240, minimum_s=60),
    Item("batching_knee", "measure", batching_knee, cap_s=60, rehearsal_cap_s=60, minimum_s=20),
    Item("serving", "measure", serving, cap_s=60, rehearsal_cap_s=60, minimum_s=15),
    Item("vllm", "measure", vllm, cap_s=10, rehearsal_cap_s=10, minimum_s=1),
]
