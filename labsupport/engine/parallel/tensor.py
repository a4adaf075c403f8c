"""Tensor parallelism, Megatron-style: one model's layers split across ranks, summed back by all-reduce.

Introduced in notebook 10 (past one device).

Read it in the order of the idea:

1. `plan_split`: who holds what. Attention is split by whole grouped-query groups: a rank holds
   some key/value heads and the query heads that read them, so attention needs nothing from
   another rank. The MLP's inner dimension is split in contiguous slices. The vocabulary of
   the output layer is split in equal slices.
2. `shard_model`: one rank's model, a `Transformer` of its own smaller config, with its slices
   of the weights. Column-parallel in (qkv, gate_up: each rank computes its own heads, its own
   inner units), row-parallel out (out, down: each rank's partial sum over its inputs), so each
   layer needs exactly two all-reduces, one after attention and one after the MLP
   (`AllReduceOutput`). The output layer is column-parallel too: each rank scores its slice of
   the vocabulary and an all-gather puts the logits together (`VocabParallelHead`).
3. The token embedding is replicated: a lookup reads one row per token, so a copy costs memory
   on every rank but no bandwidth. Where it is tied to the output layer, the rank's output slice
   is a copy of its rows.

Every rank gets identical logits, so under greedy decoding every rank picks the same token; a
sampled token is the same on every rank only with the same seed on each (or one rank samples and
broadcasts it). The rest of the engine (the KV cache, `generate`, the sampler) runs unchanged on
each rank's model. Each rank's KV cache holds only its own key/value heads. The replicated
embedding is this course's choice, for simplicity: Megatron-LM and vLLM split it by vocabulary.

The split is uneven where the degree does not divide the heads: SmolLM2-135M has 3 key/value
heads, so two ranks hold 2 and 1 (vLLM refuses such a degree; here the imbalance is measured).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import LabError
from ...inputs import whole_number
from ..config import ModelConfig
from ..models.layout import apply_layout
from ..models.transformer import Transformer


@dataclass(frozen=True)
class RankShare:
    """What one rank holds: ranges of key/value heads, query heads, MLP units and vocabulary.
    Notebook 10 (past one device)."""

    rank: int
    kv_heads: range
    q_heads: range
    mlp_units: range
    vocab: range                 # may run past the vocabulary on the last rank (padding rows)


def _even_slices(total: int, parts: int) -> list[range]:
    """`total` items in `parts` contiguous slices whose sizes differ by at most one (the larger first)."""
    base, extra = divmod(total, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (p < extra))
    return [range(bounds[p], bounds[p + 1]) for p in range(parts)]


def plan_split(config, world: int) -> list[RankShare]:
    """How `world` ranks split a model of `config`: one `RankShare` per rank.

    Notebook 10 (past one device). Refuses, in one sentence: a degree below 1, a GPT-2-family
    model, and more ranks than key/value heads (a rank without a head would have no attention).
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise LabError(f"The tensor-parallel degree must be a whole number of ranks, 1 or more; got {world!r}.")
    if not isinstance(config, ModelConfig):
        raise LabError(f"plan_split takes a model's config (model.config), got {type(config).__name__}.")
    if config.family != "llama":
        raise LabError(f"Tensor parallelism here splits Llama-family models; {config.name} is {config.family}. "
                       "Use SmolLM2 (the course's model) or another Llama-family model.")
    if world > config.num_kv_heads:
        raise LabError(f"A tensor-parallel degree of {world} needs at least {world} key/value heads, one per rank; "
                       f"{config.name} has {config.num_kv_heads}. Use a degree of {config.num_kv_heads} or fewer.")
    group = config.num_heads // config.num_kv_heads           # query heads per key/value head
    vocab_slice = -(-config.vocab_size // world)               # equal slices: all-gather wants equal sizes
    shares = []
    for rank, (kv, units) in enumerate(zip(_even_slices(config.num_kv_heads, world),
                                           _even_slices(config.intermediate_size, world))):
        shares.append(RankShare(rank, kv, range(kv.start * group, kv.stop * group), units,
                                range(rank * vocab_slice, (rank + 1) * vocab_slice)))
    return shares


@dataclass
class Collectives:
    """The rank's process group, and what its collectives cost: calls, bytes and seconds, by kind.
    Notebook 10 (past one device). `group` None: the default group (`torch.distributed`)."""

    group: object = None
    calls: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def _count(self, kind: str, tensor: torch.Tensor, started: float) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes[kind] = self.bytes.get(kind, 0) + tensor.nbytes
        self.seconds[kind] = self.seconds.get(kind, 0.0) + device_clock(tensor) - started

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place; every rank gets the sum. Alone (no process group,
        `shard_model` with world=1) there is nothing to sum."""
        if not _in_group():
            return tensor
        started = device_clock(tensor)
        torch.distributed.all_reduce(tensor, group=self.group)
        self._count("all_reduce", tensor, started)
        return tensor

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` (same shape on each), concatenated along the last dimension."""
        if not _in_group():
            return tensor
        started = device_clock(tensor)
        world = torch.distributed.get_world_size(self.group)
        parts = [torch.empty_like(tensor) for _ in range(world)]
        torch.distributed.all_gather(parts, tensor.contiguous(), group=self.group)
        self._count("all_gather", tensor, started)
        return torch.cat(parts, dim=-1)

    def reset(self) -> None:
        self.calls.clear(), self.bytes.clear(), self.seconds.clear()


def device_clock(tensor: torch.Tensor) -> float:
    """The host clock once `tensor`'s GPU has done its queued work: an NCCL call returns when the
    collective is queued, so a clock read without this times the queueing. Not while a CUDA graph
    is being captured (no synchronizing there). Notebook 10 (past one device)."""
    if tensor.is_cuda and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter()


def _in_group() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class AllReduceOutput(nn.Module):
    """A row-parallel Linear: this rank's partial sum over its share of the inputs, summed over
    the ranks. Holds the Linear itself, so a precision change or quantization (notebooks 03, 04)
    swaps it as any other. Notebook 10 (past one device)."""

    def __init__(self, linear: nn.Module, collectives: Collectives):
        super().__init__()
        self.linear = linear
        self.collectives = collectives

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.collectives.all_reduce(self.linear(x))


class VocabParallelHead(nn.Module):
    """The output layer, column-parallel: this rank scores its slice of the vocabulary, and an
    all-gather assembles the whole row of logits on every rank (padding columns cut off).
    Notebook 10 (past one device)."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, collectives: Collectives):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)      # (vocab slice, hidden)
        self.vocab_size = vocab_size
        self.collectives = collectives

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.weight)                            # (..., vocab slice)
        return self.collectives.all_gather_last(local)[..., :self.vocab_size]   # (..., vocab)


def _rows(weight: torch.Tensor, ranges: list[range]) -> torch.Tensor:
    """The rows of `weight` (out, in) in `ranges`, one after the other, as a fresh contiguous tensor."""
    return torch.cat([weight[r.start:r.stop] for r in ranges]).contiguous()


def shard_model(model: Transformer, rank: int, world: int, collectives: Collectives | None = None) -> Transformer:
    """Rank `rank`'s part of `model` for a degree of `world`: a `Transformer` of a smaller config
    whose out and down projections all-reduce and whose output layer all-gathers.

    Notebook 10 (past one device). With world=1 the slices are the whole model and nothing is
    communicated. The embedding and the norms are shared with `model`, not copied; every slice
    is a copy, stored in the layout measured fastest for its shape (`layout.apply_layout`), as
    the loaded model's are. Refuses, in one sentence: a rank outside 0 .. world - 1, and a
    quantized model (`require_float_model`: shard the float model, then quantize each share).
    """
    config = require_float_model(model).config
    shares = plan_split(config, world)
    rank = whole_number(rank, f"rank (one of the {world} ranks)", minimum=0, maximum=world - 1)
    share = shares[rank]
    if world > 1 and not _in_group():
        raise LabError(f"shard_model for {world} ranks needs a process group on every rank: start the ranks "
                       "with run_tensor_parallel (or torchrun), not in this process.")
    if collectives is not None and not isinstance(collectives, Collectives):
        raise LabError(f"collectives must be a Collectives (or None for a new one), got {type(collectives).__name__}.")
    collectives = collectives or Collectives()
    D, H, KV, inner = config.head_dim, config.num_heads, config.num_kv_heads, config.intermediate_size
    local_config = config.with_(num_heads=len(share.q_heads), num_kv_heads=len(share.kv_heads),
                                intermediate_size=len(share.mlp_units), explicit_head_dim=D)
    with torch.device("meta"):
        local = Transformer(local_config)                   # shapes only; every tensor is set below
    local.embed = model.embed                                # replicated: a lookup reads one row per token
    local.final_norm = model.final_norm
    if hasattr(model, "rope_cos"):
        local.rope_cos, local.rope_sin = model.rope_cos, model.rope_sin
    q_rows = range(share.q_heads.start * D, share.q_heads.stop * D)
    k_rows = range(H * D + share.kv_heads.start * D, H * D + share.kv_heads.stop * D)
    v_rows = range((H + KV) * D + share.kv_heads.start * D, (H + KV) * D + share.kv_heads.stop * D)
    units, up_units = share.mlp_units, range(inner + share.mlp_units.start, inner + share.mlp_units.stop)
    with torch.no_grad():
        for full, part in zip(model.blocks, local.blocks):
            part.attn_norm, part.mlp_norm = full.attn_norm, full.mlp_norm
            part.attn.qkv = _linear(_rows(full.attn.qkv.weight, [q_rows, k_rows, v_rows]),
                                    _bias(full.attn.qkv, [q_rows, k_rows, v_rows]))
            part.attn.out = AllReduceOutput(_linear(full.attn.out.weight[:, q_rows.start:q_rows.stop].contiguous(),
                                                    _bias(full.attn.out, None, rank)), collectives)
            part.mlp.gate_up = _linear(_rows(full.mlp.gate_up.weight, [units, up_units]),
                                       _bias(full.mlp.gate_up, [units, up_units]))
            part.mlp.down = AllReduceOutput(_linear(full.mlp.down.weight[:, units.start:units.stop].contiguous(),
                                                    _bias(full.mlp.down, None, rank)), collectives)
        head = model.lm_head.weight
        rows = head[share.vocab.start:min(share.vocab.stop, config.vocab_size)]
        padding = head.new_zeros(len(share.vocab) - rows.shape[0], head.shape[1])   # the last rank's tail
        local.lm_head = VocabParallelHead(torch.cat([rows, padding]).contiguous(), config.vocab_size, collectives)
    local.collectives = collectives
    apply_layout(local)                  # each slice stored in the layout its matrix-vector kernel runs fastest
    return local.eval()


def require_float_model(model) -> Transformer:
    """`model` itself, if it is a `Transformer` whose projections are float `nn.Linear`s; else one
    sentence (a quantized model's layers hold integer weights that cannot be sliced by heads).
    Notebook 10 (past one device): `shard_model` and `run_tensor_parallel` check it first."""
    if not isinstance(model, Transformer):
        raise LabError(f"Tensor parallelism splits a labsupport Transformer (load_model, random_model), "
                       f"got {type(model).__name__}.")
    for name, module in _projections(model):
        if not (isinstance(module, nn.Linear) and module.weight.is_floating_point()):
            raise LabError(f"{name} is {type(module).__name__}, not a float nn.Linear (a quantized or already "
                           "sharded model): shard the float model first, then quantize each rank's share "
                           "(quantize_model on the rank's model).")
    return model


def _projections(model: Transformer):
    """(name, module) of every matrix shard_model slices."""
    for i, block in enumerate(model.blocks):
        for part, name in ((block.attn, "attn.qkv"), (block.attn, "attn.out"), (block.mlp, "mlp.gate_up"),
                           (block.mlp, "mlp.down")):
            if hasattr(part, name.split(".")[1]):                # GPT-2's MLP has none: plan_split refuses it
                yield f"blocks.{i}.{name}", getattr(part, name.split(".")[1])
    yield "lm_head", model.lm_head


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An nn.Linear holding `weight` (out, in) and `bias` as they are (no copy, no initialisation)."""
    with torch.device("meta"):
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def _bias(linear: nn.Linear, ranges: list[range] | None, rank: int = 0) -> torch.Tensor | None:
    """A column-parallel layer's bias slices (`ranges`), or a row-parallel layer's whole bias on
    rank 0 only (ranges None): the all-reduce would otherwise add it once per rank."""
    if linear.bias is None:
        return None
    if ranges is None:
        return linear.bias.detach().clone() if rank == 0 else None
    return torch.cat([linear.bias[r.start:r.stop] for r in ranges]).contiguous()
