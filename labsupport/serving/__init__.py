"""A small, real serving engine: requests, a paged KV cache with prefix caching, a
scheduler (static or continuous batching, optionally chunked prefill under a token
budget), an engine step, workloads and metrics.

Introduced in notebook 06 (continuous batching). Read the modules in this order:
request -> prefix_cache -> block_manager -> paged_cache -> scheduler -> model_runner ->
engine -> workload -> metrics; decode_cost measures what the decode step spends where.
"""

from .block_manager import BlockManager, blocks_needed
from .engine import Engine, ServingResult, StepRecord
from .metrics import reserved_vs_used, slot_bars, summarize, utilization_timeline
from .paged_cache import PagedKVCache
from .prefix_cache import PrefixCache, block_hash
from .request import Request, ServedSequence, Status
from .scheduler import (POLICIES, ContinuousBatching, Policy, ScheduledStep, Scheduler, StaticBatching,
                        budget_prefill_chunks)
from .workload import chat_prompts, make_workload

__all__ = ["BlockManager", "blocks_needed", "Engine", "ServingResult", "StepRecord", "reserved_vs_used",
           "slot_bars", "summarize", "utilization_timeline", "PagedKVCache", "Request", "ServedSequence",
           "Status", "PrefixCache", "block_hash", "budget_prefill_chunks", "POLICIES", "Policy", "StaticBatching", "ContinuousBatching", "ScheduledStep", "Scheduler", "chat_prompts", "make_workload"]
