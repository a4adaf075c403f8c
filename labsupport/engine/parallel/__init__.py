"""Past one device: tensor parallelism (tensor.py: who holds which weights, the two all-reduces
per layer) and the processes that run it (launch.py). Introduced in notebook 10 (past one device)."""

from .launch import free_port, run_ranks, run_tensor_parallel
from .tensor import AllReduceOutput, Collectives, RankShare, VocabParallelHead, plan_split, shard_model

__all__ = ["AllReduceOutput", "Collectives", "RankShare", "VocabParallelHead", "free_port", "plan_split",
           "run_ranks", "run_tensor_parallel", "shard_model"]
