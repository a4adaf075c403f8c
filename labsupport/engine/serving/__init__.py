"""A small, real serving engine: requests, a paged KV cache with prefix caching, a
scheduler (static or continuous batching, optionally chunked prefill under a token
budget) and an engine step.

Introduced in notebook 06 (continuous batching). Read the modules in this order:
request -> prefix_cache -> block_manager -> paged_cache -> scheduler -> model_runner ->
engine. The workloads, metrics, load curve and decode-step costs that measure it are in
lab/ (serving_workload, serving_metrics, load_curve, decode_cost).
"""

from .block_manager import BlockManager, blocks_needed
from .engine import Engine, ServingResult, StepRecord
from .paged_cache import PagedKVCache
from .prefix_cache import PrefixCache, block_hash
from .request import Request, ServedSequence, Status
from .scheduler import (POLICIES, ContinuousBatching, Decision, Policy, ScheduledStep, Scheduler, SchedulerView,
                        StaticBatching, budget_prefill_chunks)

__all__ = ["BlockManager", "blocks_needed", "Engine", "ServingResult", "StepRecord", "PagedKVCache", "Request",
           "ServedSequence", "Status", "PrefixCache", "block_hash", "budget_prefill_chunks", "POLICIES", "Policy",
           "StaticBatching", "ContinuousBatching", "ScheduledStep", "Scheduler", "SchedulerView", "Decision"]
