"""The serving peers: production engines given the same requests as labsupport's `Engine`.

Introduced in notebook 06 (continuous batching): Hugging Face's continuous batching
(`hf_serve`), and vLLM's offline engine (`vllm_serve`) where it is installed on a
CUDA machine (it is never a dependency of the course: elsewhere its row says why it
was skipped).
"""

from __future__ import annotations

import threading
import time

import torch

from ...errors import LabError
from ...engine.hardware import synchronize
from ...engine.serving.request import Request
from .huggingface import hf_greedy_config


def _require_greedy(requests: list[Request], peer: str) -> None:
    if any(not r.sampling.greedy for r in requests):
        raise LabError(f"{peer} is compared on greedy requests only; use temperature 0 (GREEDY).")


def hf_serve(hf_model, requests: list[Request], max_slots: int = 8, block_size: int = 16,
             defaults: bool = False, token_budget: int | None = None, prefix_sharing: bool = False,
             cache_tokens: int | None = None, timeout: float = 600.0) -> dict:
    """Serve `requests` with transformers' own continuous batching, each fed at its arrival time.

    Introduced in notebook 06 (continuous batching). transformers ships a continuous-batching
    manager with a paged cache (`model.generate_batch`, built on `init_continuous_batching`);
    this gives it the same requests as our engine (each with its own output length,
    end-of-sequence ignored, greedy), each added when `request.arrival` seconds have passed
    since the start, and at most `max_slots` requests per batch, in a paged cache of
    `cache_tokens` positions (default: `max_slots` x the longest request, as our engine's
    benchmark; transformers would otherwise size it from the free memory, which takes seconds).

    defaults=False: our engine's setting: pages of `block_size` positions, no CUDA graphs,
    `token_budget` tokens per step (None: transformers' own choice) and block sharing between
    requests only with `prefix_sharing`. defaults=True: transformers' own defaults for
    everything but the slot limit (its page size, its token budget, i.e. chunked prefill, and
    its prefix block sharing, as `generate_batch` ships them).

    Returns {"tokens": {request_id: [ids]}, "seconds": wall time from the start to the last
    token, "arrivals": {request_id: arrival}, "token_times": {request_id: [seconds from the
    start at which each token came out]} (empty lists where transformers records none),
    "config": what was set, in words}.
    """
    ContinuousBatchingConfig = _continuous_batching_config_class()
    _require_greedy(requests, "hf_serve")
    config = hf_greedy_config(hf_model, max(r.max_new_tokens for r in requests))
    config.eos_token_id = -1                      # stop at each request's own length only
    if cache_tokens is None:
        cache_tokens = max_slots * max(r.max_length for r in requests)
    cb_config, described = _cb_config(ContinuousBatchingConfig, max_slots, cache_tokens, defaults, block_size,
                                      token_budget, prefix_sharing)
    original_attention = _use_paged_attention(hf_model, ContinuousBatchingConfig)
    manager = None
    ordered = sorted(requests, key=lambda r: r.arrival)
    try:
        manager = hf_model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)
        manager.start()
        _warm_up(manager, ordered[0], timeout)    # its cache and first batch, outside the timed run
        results, stamps, seconds = _serve_at_arrivals(manager, hf_model.device, ordered, timeout)
    finally:
        if manager is not None:
            manager.stop(block=True, timeout=10)
            getattr(manager, "destroy", lambda: None)()
        if hf_model.config._attn_implementation != original_attention:
            hf_model.set_attn_implementation(original_attention)
    return {"tokens": results, "seconds": seconds, "arrivals": {r.request_id: r.arrival for r in requests},
            "token_times": stamps, "config": described}


def _cb_config(config_class, max_slots: int, cache_tokens: int, defaults: bool, block_size: int,
               token_budget: int | None, prefix_sharing: bool) -> tuple[object, str]:
    """`hf_serve`'s `ContinuousBatchingConfig`, and what was set, in words. Notebook 06 (continuous batching)."""
    page_field = _page_field(config_class)
    # transformers switches a model to FlashAttention by itself when flash_attn is installed, also
    # for fp32, which FlashAttention does not take: newer versions read `auto_switch_to_flash`
    # (set off here); older ones leave a model on a paged implementation alone (paged SDPA below).
    no_switch = {"auto_switch_to_flash": False} if "auto_switch_to_flash" in _fields(config_class) else {}
    if defaults:
        page = getattr(config_class(), page_field)
        cb_config = config_class(max_requests_per_batch=max_slots, num_blocks=-(-cache_tokens // page), **no_switch)
        described = f"transformers' defaults, at most {max_slots} requests per batch"
    else:
        cb_config = config_class(**{page_field: block_size}, max_requests_per_batch=max_slots,
                                 num_blocks=-(-cache_tokens // block_size),
                                 max_batch_tokens=token_budget, allow_block_sharing=prefix_sharing,
                                 use_cuda_graph=False, **no_switch)
        described = (f"pages of {block_size}, at most {max_slots} requests per batch, token budget "
                     f"{token_budget or 'transformers’ own'}, prefix sharing {'on' if prefix_sharing else 'off'}")
    return cb_config, described


def _use_paged_attention(hf_model, config_class) -> str:
    """Paged attention for `hf_model` where needed; returns the one it had. Notebook 06 (continuous batching)."""
    # Without that field: paged SDPA (or paged eager) for this run, put back after. With it, SDPA
    # needs no prefix (transformers 5.2x warns that "paged|sdpa" goes away in 5.23) and eager
    # becomes "paged|eager" by itself.
    original_attention = hf_model.config._attn_implementation
    if "auto_switch_to_flash" not in _fields(config_class) and "paged|" not in str(original_attention):
        hf_model.set_attn_implementation(f"paged|{'eager' if original_attention == 'eager' else 'sdpa'}")
    return original_attention


def _serve_at_arrivals(manager, device, ordered: list[Request], timeout: float) -> tuple[dict, dict, float]:
    """Feed each request at its arrival time: (tokens, token times, wall seconds). Notebook 06 (continuous batching)."""
    results, stamps, ids, failure = {}, {}, {}, []
    synchronize(device)
    start = time.perf_counter()

    def feed():                               # each request enters when its arrival time has come
        try:
            for r in ordered:
                time.sleep(max(0.0, start + r.arrival - time.perf_counter()))
                hf_id = manager.add_request(list(r.prompt), request_id=str(r.request_id),
                                            max_new_tokens=r.max_new_tokens, record_timestamps=True)
                ids[hf_id] = r.request_id
        except Exception as error:            # surfaced by the main thread below
            failure.append(error)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    while len(results) < len(ordered) and not failure:
        out = manager.get_result(timeout=timeout)
        if out is None:
            raise LabError("Hugging Face's continuous batching stopped without finishing every request.")
        if out.is_finished():
            if out.error:
                raise LabError(f"Hugging Face's continuous batching failed: {out.error}")
            name = ids.get(out.request_id, out.request_id)
            results[name] = list(out.generated_tokens)
            stamps[name] = [t - start for t in (out.timestamps or [])]
    synchronize(device)
    seconds = time.perf_counter() - start
    feeder.join(timeout=timeout)
    if failure:
        raise LabError(f"Adding a request to Hugging Face's continuous batching failed: {failure[0]}")
    return results, stamps, seconds


def _continuous_batching_config_class():
    """transformers' `ContinuousBatchingConfig`, or one sentence where this transformers has none
    (it came with transformers 5; pyproject allows 4.46 for everything else)."""
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        import transformers
        raise LabError(f"Hugging Face's continuous batching needs a transformers with ContinuousBatchingConfig "
                       f"(5.x; this is {transformers.__version__}): pip install -U transformers, or leave the "
                       f"Hugging Face serving row out.") from None
    return ContinuousBatchingConfig


def _fields(config_class) -> set[str]:
    """The field names of a transformers config dataclass (they change between versions)."""
    import dataclasses
    return {f.name for f in dataclasses.fields(config_class)}


def _page_field(config_class) -> str:
    """The name of the cache page size in `ContinuousBatchingConfig`: "block_size" up to
    transformers 5.17 or so, "page_size" later (both read from the dataclass's own fields)."""
    return "page_size" if "page_size" in _fields(config_class) else "block_size"


def _warm_up(manager, request: Request, timeout: float) -> None:
    """Wait for the manager's set-up (its paged cache is sized and allocated in the background
    thread, which takes seconds) and serve one token of one prompt, untimed."""
    manager.add_request(list(request.prompt), request_id="warm-up", max_new_tokens=1)
    while True:
        out = manager.get_result(timeout=timeout)
        if out is None:
            raise LabError("Hugging Face's continuous batching did not start; see the log above.")
        if out.is_finished():
            return


def vllm_skip_reason(device) -> str | None:
    """Why vLLM cannot serve here, in one sentence, or None when it can (a CUDA device and
    `vllm` importable). Introduced in notebook 06 (continuous batching)."""
    if torch.device(device).type != "cuda":
        return "vLLM skipped: it needs a CUDA GPU, and this run is on " + torch.device(device).type + "."
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM skipped: the vllm package is not installed (it is never a dependency of the course)."
    return None


def vllm_memory_fraction(free_bytes: int, total_bytes: int) -> float | None:
    """vLLM's `gpu_memory_utilization` given the memory free now: the share of the whole card this
    instance may take (recent vLLM refuses to start when that is more than is free), so 80% of
    the free memory, at most half the card; None when less than a tenth of the card is free.
    Notebook 06 (continuous batching)."""
    if free_bytes < 0.1 * total_bytes:
        return None
    return round(min(0.5, 0.8 * free_bytes / total_bytes), 3)


def vllm_serve(model_source: str, requests: list[Request], device, max_slots: int = 8,
               reference: dict | None = None, dtype: str = "bfloat16", prefix_caching: bool = False) -> dict:
    """The same requests through vLLM's offline engine (`LLM.generate`), as a production peer.

    Introduced in notebook 06 (continuous batching). model_source: the model's directory
    (`weights.loading.resolve_hf_source`); every request greedy, end-of-sequence ignored, its
    own `max_tokens`, all submitted at once (the offline API has no arrival times), at most
    `max_slots` sequences per batch. reference: request id -> tokens of our engine, to count
    requests with the same tokens. dtype: the dtype of the row it is set beside (the bench passes
    its own); prefix_caching: vLLM's automatic prefix caching, off to match our plain row. Its
    share of the GPU is sized from the memory free when it starts (never more than half the
    card), and freed when it returns.

    Returns {"server": "vLLM", "skipped": None or the reason in one sentence, "tokens",
    "seconds", "tokens_per_s", "same_tokens": (requests equal to `reference`, requests) or None}.
    vLLM is never a dependency: without a CUDA device or the package, or when it fails on this
    model, the row only says why.
    """
    row = {"server": "vLLM", "skipped": vllm_skip_reason(device), "tokens": {}, "seconds": float("nan"),
           "tokens_per_s": float("nan"), "same_tokens": None}
    if row["skipped"] is not None:
        return row
    _require_greedy(requests, "vllm_serve")
    from vllm import LLM, SamplingParams

    prompts = [{"prompt_token_ids": list(r.prompt)} for r in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_new_tokens, ignore_eos=True) for r in requests]
    utilization = vllm_memory_fraction(*torch.cuda.mem_get_info(torch.device(device)))
    if utilization is None:
        row["skipped"] = "vLLM skipped: less than a tenth of the GPU's memory is free after the earlier sections."
        return row
    llm = None
    try:
        llm = LLM(model=model_source, dtype=dtype, max_num_seqs=max_slots, gpu_memory_utilization=utilization,
                  enable_prefix_caching=prefix_caching, seed=0)
        llm.generate(prompts[:1], params[:1], use_tqdm=False)       # warm-up: graphs and kernels
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        row["seconds"] = time.perf_counter() - start
    except Exception as error:                   # noqa: BLE001 - a peer's failure is a row, not a crash
        row["skipped"] = f"vLLM skipped: it failed to serve this model ({type(error).__name__}: {str(error)[:120]})."
        return row
    finally:
        del llm                                  # its weights and its KV-cache reservation
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    row["config"] = f"{dtype}, prefix caching {'on' if prefix_caching else 'off'}, {utilization:.0%} of the GPU"
    row["tokens"] = {r.request_id: list(out.outputs[0].token_ids) for r, out in zip(requests, outputs)}
    row["tokens_per_s"] = sum(len(t) for t in row["tokens"].values()) / row["seconds"]
    if reference is not None:
        row["same_tokens"] = (sum(row["tokens"].get(i) == t for i, t in reference.items()), len(reference))
    return row
