"""The serving peers: production engines given the same requests as labsupport's `Engine`.

Introduced in notebook 06 (continuous batching): Hugging Face's continuous batching
(`hf_serve`).
"""

from __future__ import annotations

import time

from ..errors import LabError
from ..hardware import synchronize
from ..serving.request import Request
from .peers import hf_greedy_config


def hf_serve(hf_model, requests: list[Request], max_slots: int = 8, block_size: int = 16,
             timeout: float = 600.0) -> dict:
    """Serve `requests` (all at once) with transformers' own continuous batching.

    Introduced in notebook 06 (continuous batching). transformers ships a
    continuous-batching manager with a paged cache (`model.generate_batch`, built on
    `init_continuous_batching`); this gives it the same requests as our engine (each
    with its own output length, end-of-sequence ignored, greedy) and the same limit on
    concurrent requests. Returns {"tokens": {request_id: [ids]}, "seconds": wall time
    from the first request to the last token}. Only greedy requests without arrival
    times are supported.
    """
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if any(not r.sampling.greedy for r in requests):
        raise LabError("hf_serve compares greedy requests only; use temperature 0.")
    config = hf_greedy_config(hf_model, max(r.max_new_tokens for r in requests))
    config.eos_token_id = -1                      # stop at each request's own length only
    cb_config = ContinuousBatchingConfig(page_size=block_size, max_requests_per_batch=max_slots,
                                         use_cuda_graph=False)
    manager = hf_model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)
    manager.start()
    results, ids = {}, {}
    try:
        synchronize(hf_model.device)
        start = time.perf_counter()
        for r in requests:
            hf_id = manager.add_request(list(r.prompt), request_id=str(r.request_id),
                                        max_new_tokens=r.max_new_tokens)
            ids[hf_id] = r.request_id
        while len(results) < len(requests):
            out = manager.get_result(timeout=timeout)
            if out is None:
                raise LabError("Hugging Face's continuous batching stopped without finishing every request.")
            if out.is_finished():
                if out.error:
                    raise LabError(f"Hugging Face's continuous batching failed: {out.error}")
                results[ids[out.request_id]] = list(out.generated_tokens)
        synchronize(hf_model.device)
        seconds = time.perf_counter() - start
    finally:
        manager.stop(block=True, timeout=10)
        getattr(manager, "destroy", lambda: None)()
    return {"tokens": results, "seconds": seconds}
