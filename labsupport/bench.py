"""Benchmarks: every speed figure of the course, measured side by side, as JSON.

Introduced in notebook 00 (where the time goes); each notebook adds its section.

Run ``python -m labsupport bench`` (see ``--help``). Each section is a function
``(context, options) -> dict`` registered in `SECTIONS`; its dict holds the raw
timings and a list of `figure` entries (name, value, unit, target, met). Every
ratio is measured in one run, with the candidates interleaved
(`measure.time_side_by_side`), because shared machines are noisy. Absolute
times mean something only on a dedicated GPU.
"""

from __future__ import annotations

import copy
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .generate import chat_prompt, generate, generate_naive
from .hardware import HardwareProfile, probe
from .kv_cache import kv_cache_bytes
from .measure import time_side_by_side, track_peak_memory
from .models.config import PRESETS

DEFAULT_PROMPT = "Explain in a few paragraphs why the sky is blue and why sunsets are red."


def figure(name: str, value: float, unit: str, target: float | None = None,
           higher_is_better: bool = True, claim: str | None = None, note: str = "") -> dict:
    """One reported number, with its target (if the course sets one) and the chapter's claim."""
    met = None
    if target is not None:
        met = bool(value >= target) if higher_is_better else bool(value <= target)
    return {"name": name, "value": value, "unit": unit, "target": target, "met": met,
            "claim": claim, "note": note}


@dataclass
class BenchContext:
    """What the sections share: the device, the models (loaded once) and the machine profile."""

    device: torch.device
    model_name: str = "smollm2-135m"
    _cache: dict = field(default_factory=dict)

    def model(self, dtype=torch.float32):
        key = ("ours", dtype)
        if key not in self._cache:
            from .models.loading import load_model
            self._cache[key] = load_model(self.model_name, device=self.device, dtype=dtype)
        return self._cache[key]

    def hf_model(self, dtype=torch.float32):
        key = ("hf", dtype)
        if key not in self._cache:
            from .models.loading import load_hf_model
            self._cache[key] = load_hf_model(self.model_name, device=self.device, dtype=dtype)
        return self._cache[key]

    @property
    def hardware(self) -> HardwareProfile:
        if "hardware" not in self._cache:
            self._cache["hardware"] = probe(self.device)
        return self._cache["hardware"]


def hf_greedy_config(hf_model, new_tokens: int):
    """Hugging Face generation settings: greedy, exactly `new_tokens` tokens (end-of-sequence disabled)."""
    config = copy.deepcopy(hf_model.generation_config)
    config.eos_token_id = None
    config.max_new_tokens = new_tokens
    config.do_sample = False
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    return config


def hf_generate_fn(hf_model, prompt_ids: list[int], new_tokens: int):
    """Hugging Face greedy generate() for exactly `new_tokens` tokens, batch 1."""
    config = hf_greedy_config(hf_model, new_tokens)
    inputs = torch.tensor([prompt_ids], device=hf_model.device)

    @torch.inference_mode()
    def run():
        return hf_model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config)
    return run


def section_baseline(ctx: BenchContext, options: dict) -> dict:
    """labsupport generate() against Hugging Face generate(): same model, prompt and
    tokens; fp32, greedy, batch 1. Also the bandwidth a decode step reaches."""
    new_tokens, repeats = options["new_tokens"], options["repeats"]
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    ids = tok.encode(chat_prompt(tok, options.get("prompt", DEFAULT_PROMPT)))

    ours_out, hf_out = {}, {}

    def ours():
        ours_out["result"] = generate(model, ids, new_tokens, eos_token_ids=())

    hf_run = hf_generate_fn(hf, ids, new_tokens)

    def theirs():
        hf_out["tokens"] = hf_run()[0, len(ids):].tolist()

    with track_peak_memory(ctx.device) as memory:
        timings = time_side_by_side({"labsupport": ours, "huggingface": theirs}, ctx.device,
                                    warmup=1, repeats=repeats)
    result = ours_out["result"]
    same_tokens = result.row(0) == hf_out["tokens"]
    ours_tps = new_tokens / timings["labsupport"].median
    hf_tps = new_tokens / timings["huggingface"].median

    # Bandwidth: bytes of weights a decode step reads x decode steps per second.
    decode_tps = result.decode_tokens_per_s
    weight_bytes = model.weight_bytes()
    mean_context = len(ids) + new_tokens / 2
    kv_bytes = kv_cache_bytes(model.config, int(mean_context), 1, model.dtype)
    achieved = weight_bytes * decode_tps
    copy_bw = ctx.hardware.bandwidth
    return {
        "prompt_tokens": len(ids), "new_tokens": new_tokens, "dtype": "float32", "batch": 1,
        "same_tokens_as_huggingface": same_tokens,
        "timings_s": {k: v.to_dict() for k, v in timings.items()},
        "tokens_per_s": {"labsupport": ours_tps, "huggingface": hf_tps},
        "decode_tokens_per_s": decode_tps,
        "weight_bytes_per_token": weight_bytes,
        "kv_cache_bytes_per_token_mean": kv_bytes,
        "bandwidth_achieved_bytes_per_s": achieved,
        "copy_bandwidth_bytes_per_s": copy_bw,
        "peak_memory_bytes": memory.peak_bytes,
        "figures": [
            figure("labsupport generate / HF generate (fp32, greedy, batch 1)",
                   ours_tps / hf_tps, "x", target=1.5,
                   note=f"{ours_tps:.1f} vs {hf_tps:.1f} tokens/s, {new_tokens} new tokens; "
                        f"same tokens: {same_tokens}"),
            figure("decode bandwidth achieved / measured copy bandwidth", achieved / copy_bw, "fraction",
                   target=0.5, claim="small batches are memory-bandwidth-bound",
                   note=f"{weight_bytes / 1e6:.0f} MB of weights x {decode_tps:.1f} steps/s = "
                        f"{achieved / 1e9:.1f} GB/s of {copy_bw / 1e9:.1f} GB/s"),
        ],
    }


def _kv_positions(lengths: list[int]) -> list[int]:
    """Positions at which to time single steps: the first, and the middle and last of
    every length, so that each length's estimate rests on points inside its own range."""
    return sorted({0} | {n // 2 for n in lengths} | {n - 1 for n in lengths})


def section_kv_cache(ctx: BenchContext, options: dict) -> dict:
    """The chapter's loop without a cache against the static KV cache.

    For each length in ``kv_lengths``: a full run of both, side by side and with the
    same tokens checked, for the shortest length and wherever the uncached run is cheap
    enough (estimated under ``kv_naive_budget_s``); otherwise an estimate from single
    steps timed at a few positions and summed over every position (`kv_timing`). The figure's note
    says which. Also the memory arithmetic: GQA's saving, a 7B cache at 512 vs 128K.
    """
    from .kv_timing import estimated_total_seconds, gqa_savings, time_per_token_by_position

    model, tok = ctx.model(torch.float32)
    ids = tok.encode(options.get("kv_prompt", "Once upon a time, in a small village by the sea,"))
    lengths = sorted(options["kv_lengths"])
    repeats = options["kv_repeats"]
    budget = options.get("kv_naive_budget_s", 90.0)

    positions = _kv_positions(lengths)
    steps = time_per_token_by_position(model, positions, prompt_len=len(ids),
                                       repeats=options.get("kv_step_repeats", 3))
    rows, estimated_rows, figures = [], [], []
    for new_tokens in lengths:
        estimate = estimated_total_seconds(steps, new_tokens)
        estimated_speedup = estimate["naive_s"] / estimate["cached_s"]
        if new_tokens != lengths[0] and estimate["naive_s"] > budget:
            estimated_rows.append({"new_tokens": new_tokens, "speedup": estimated_speedup,
                                   "estimated_s": estimate})
            figures.append(figure(
                f"KV cache speedup over the uncached loop, {new_tokens} new tokens (estimated)",
                estimated_speedup, "x", target=4.0 if new_tokens == 256 else None,
                note=f"ESTIMATE, not a full run: single steps timed at positions {positions} and summed over "
                     f"positions 0..{new_tokens - 1} ({estimate['naive_s']:.0f} s vs {estimate['cached_s']:.1f} s; "
                     f"a full uncached run would take about {estimate['naive_s']:.0f} s, over the "
                     f"{budget:.0f} s budget)"))
            continue
        out = {}

        def cached():
            out["cached"] = generate(model, ids, new_tokens, eos_token_ids=())

        def naive():
            out["naive"] = generate_naive(model, ids, new_tokens, eos_token_ids=())

        timings = time_side_by_side({"cached": cached, "naive": naive}, ctx.device,
                                    warmup=0, repeats=repeats)
        speedup = timings["naive"].median / timings["cached"].median
        same = out["cached"].tokens.tolist() == out["naive"].tokens.tolist()
        rows.append({"new_tokens": new_tokens, "same_tokens": same, "speedup": speedup,
                     "estimated_speedup": estimated_speedup, "estimated_s": estimate,
                     "timings_s": {k: v.to_dict() for k, v in timings.items()}})
        figures.append(figure(
            f"KV cache speedup over the uncached loop, {new_tokens} new tokens", speedup, "x",
            target=4.0 if new_tokens == 256 else None,
            note=f"measured: full runs side by side, {timings['naive'].median:.1f} s vs "
                 f"{timings['cached'].median:.2f} s; same tokens: {same}"
                 + ("" if same else " (TOKENS DIFFER)")
                 + f"; the per-step estimate said {estimated_speedup:.1f}x"))

    savings = gqa_savings(model.config, length=1024)
    figures.append(figure(
        f"KV cache saved by grouped-query attention ({savings['kv_heads']} vs {savings['num_heads']} kv heads)",
        savings["ratio"], "x",
        note=f"{savings['gqa_bytes'] / 2**20:.0f} MiB vs {savings['mha_bytes'] / 2**20:.0f} MiB "
             f"at 1024 tokens, fp32, batch 1"))
    seven_b = PRESETS["llama-7b-shape"]
    small, large = (kv_cache_bytes(seven_b, n, 1, torch.float16) for n in (512, 128 * 1024))
    figures.append(figure("KV cache of a 7B model (fp16, batch 1): 128K tokens / 512 tokens",
                          large / small, "x", claim="contexts grew from 512 to 128K tokens",
                          note=f"{small / 2**20:.0f} MiB at 512 tokens, {large / 2**30:.0f} GiB at 128K"))
    return {"prompt_tokens": len(ids), "per_position_s": steps, "rows": rows,
            "estimated_rows": estimated_rows, "gqa": savings, "figures": figures}


def _sections() -> dict:
    """Every section, in the course's order. The later ones live beside their technique
    (they import this module lazily, so importing them here is safe)."""
    from .batching import section_batching
    from .precision import section_precision
    from .quantize_bench import section_quantization
    from .roofline import section_roofline
    from .serving.bench import section_serving
    from .speculative import section_speculative
    from .stack import section_stack
    return {"baseline": section_baseline, "roofline": section_roofline, "kv_cache": section_kv_cache,
            "batching": section_batching, "precision": section_precision,
            "quantization": section_quantization, "speculative": section_speculative,
            "serving": section_serving, "stack": section_stack}


SECTIONS = _sections()
DEFAULTS = {"new_tokens": 128, "repeats": 5, "kv_lengths": [64, 256, 1024], "kv_repeats": 1}


def machine_info(ctx: BenchContext) -> dict:
    hw = ctx.hardware
    return {"device": str(ctx.device), "device_name": hw.name, "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(),
            "hardware": hw.to_dict()}


def run(sections=None, device=None, model_name="smollm2-135m", progress=print, **overrides) -> dict:
    """Run the named sections (default: all) and return their results as one dict."""
    from .hardware import pick_device
    options = {**DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    ctx = BenchContext(device=pick_device(device), model_name=model_name)
    report = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "model": model_name,
              "options": options, "machine": machine_info(ctx), "sections": {}}
    for name in sections or SECTIONS:
        progress(f"[bench] {name} ...")
        start = time.perf_counter()
        report["sections"][name] = SECTIONS[name](ctx, options)
        report["sections"][name]["seconds"] = time.perf_counter() - start
    return report


def all_figures(report: dict) -> list[dict]:
    return [f for section in report["sections"].values() for f in section.get("figures", [])]


def write_json(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    return path
