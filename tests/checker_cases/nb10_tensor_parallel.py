"""Checker cases of notebook 10 (past one device): the reference and each typical mistake.

The split's answers run on two spawned ranks, which get their source (not an import), so each
answer is a function of its own, written as a learner would, and helpers are module functions."""

import importlib
import types

import torch.nn.functional as F

from labsupport.checks import tensor_parallel, tensor_parallel_goodput
from labsupport.checks.tensor_parallel_goodput import check_goodput, reference_goodput
from labsupport.checks.tensor_parallel import check_all_reduce_cost, check_mlp_split, reference_all_reduce_seconds
from labsupport.engine.parallel.tensor import _even_slices, shard_model
from labsupport.explorers.tensor_parallel import all_reduce_seconds
from labsupport.lab import serving_metrics, tensor_parallel_disaggregated
from labsupport.lab.tensor_parallel import link_arithmetic

from checker_cases.common import accepts, refuses

OWN = "expected your own code"

# (grade id -> {mutant: why no valid input tells it from the notebook's solution}); scripts/checker_mutants.py
EQUIVALENT_MUTANTS = {
    "tp-all-reduce-cost": {
        "4:15:constant:0.0*2": "return 0.0 * 2 returns 0.0, the same float",
    },
}


# --- exercise 1: one MLP split across two real ranks ---------------------------------------

def mlp_on_rank(x, gate_up_weight, down_weight, rank, world, all_reduce):
    """The notebook's solution."""
    inner = down_weight.shape[1]
    start, stop = rank * inner // world, (rank + 1) * inner // world
    gate = gate_up_weight[start:stop]                               # (units, hidden)
    up = gate_up_weight[inner + start: inner + stop]                # (units, hidden)
    h = F.silu(x @ gate.T) * (x @ up.T)                             # (T, units)
    partial = h @ down_weight[:, start:stop].T                      # (T, hidden): this rank's partial sum
    return all_reduce(partial)


def my_units(inner, rank, world):
    return slice(rank * inner // world, (rank + 1) * inner // world)


def mlp_by_chunks(x, gate_up_weight, down_weight, rank, world, all_reduce):
    """Another right answer: gate_up chunked in two first, the slice from a helper, F.linear."""
    gate, up = gate_up_weight.chunk(2)
    units = my_units(down_weight.shape[1], rank, world)
    h = F.silu(F.linear(x, gate[units])) * F.linear(x, up[units])
    return all_reduce(F.linear(h, down_weight[:, units]))


def no_all_reduce(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    start, stop = rank * inner // world, (rank + 1) * inner // world
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return h @ down_weight[:, start:stop].T                         # the partial sum, never added up


def halves_of_gate_up(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    start, stop = rank * inner // world, (rank + 1) * inner // world
    rows = 2 * inner // world                                       # rank 0: all the gate rows; rank 1: all up
    gate, up = gate_up_weight[rank * rows:(rank + 1) * rows].chunk(2)
    return all_reduce((F.silu(x @ gate.T) * (x @ up.T)) @ down_weight[:, start:stop].T)


def rows_of_down(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    start, stop = rank * inner // world, (rank + 1) * inner // world
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return all_reduce(h @ down_weight[start:stop].T)               # rows, not columns


def all_reduce_of_h(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    start, stop = rank * inner // world, (rank + 1) * inner // world
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return all_reduce(h) @ down_weight[:, start:stop].T


def whole_mlp(x, gate_up_weight, down_weight, rank, world, all_reduce):
    gate, up = gate_up_weight.chunk(2)                               # every rank computes everything
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down_weight.T


def two_all_reduces(x, gate_up_weight, down_weight, rank, world, all_reduce):
    partial = mlp_on_rank(x, gate_up_weight, down_weight, rank, world, lambda t: t)
    all_reduce(partial)
    return all_reduce(partial)


def divided_by_world(x, gate_up_weight, down_weight, rank, world, all_reduce):
    return mlp_on_rank(x, gate_up_weight, down_weight, rank, world, all_reduce) / world    # a mean


def interleaved(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    gate, up = gate_up_weight[rank:inner:world], gate_up_weight[inner + rank::world]     # every world-th unit
    return all_reduce((F.silu(x @ gate.T) * (x @ up.T)) @ down_weight[:, rank::world].T)


def split_from_the_package(x, gate_up_weight, down_weight, rank, world, all_reduce):
    """The right numbers, with the slice from the package's plan_split."""
    from labsupport.engine.parallel import plan_split
    inner = down_weight.shape[1]
    config = types.SimpleNamespace(family="llama", name="mlp", num_heads=world, num_kv_heads=world,
                                   intermediate_size=inner, vocab_size=world)
    units = plan_split(config, world)[rank].mlp_units
    start, stop = units.start, units.stop
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return all_reduce(h @ down_weight[:, start:stop].T)


def split_by_default(x, gate_up_weight, down_weight, rank, world, all_reduce, _shard=shard_model):
    """The package's shard_model held as a default argument (refused before any rank starts)."""
    return all_reduce(x) if _shard is None else x


def _units_from_the_engine(inner, world, rank):
    return _even_slices(inner, world)[rank]                          # the engine's split of the units


def split_by_a_helper(x, gate_up_weight, down_weight, rank, world, all_reduce):
    inner = down_weight.shape[1]
    units = _units_from_the_engine(inner, world, rank)
    start, stop = units.start, units.stop
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return all_reduce(h @ down_weight[:, start:stop].T)


def split_by_the_checkers_candidates(x, gate_up_weight, down_weight, rank, world, all_reduce):
    case = {"x": x, "gate_up": gate_up_weight, "down": down_weight}
    return all_reduce(tensor_parallel._candidates(case, rank, world)["partial"])


def split_by_a_built_name(x, gate_up_weight, down_weight, rank, world, all_reduce):
    """The engine's split found by a name the source does not show: the stand-in on each rank refuses it."""
    split = getattr(importlib.import_module("labsupport.engine.parallel.tensor"), "_even" + "_slices")
    inner = down_weight.shape[1]
    units = split(inner, world)[rank]
    start, stop = units.start, units.stop
    h = F.silu(x @ gate_up_weight[start:stop].T) * (x @ gate_up_weight[inner + start:inner + stop].T)
    return all_reduce(h @ down_weight[:, start:stop].T)


# --- exercise 2: the seconds in all-reduces -------------------------------------------------

def all_reduce_seconds_per_step(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
    """The notebook's solution."""
    if world == 1:
        return 0.0
    message = tokens * hidden * bytes_per_value
    return 2 * layers * (latency_us * 1e-6 + 2 * (world - 1) / world * message / (gb_per_s * 1e9))


def seconds(per_layer=2, ring=lambda w: 2 * (w - 1) / w, gb=1e9, latency=1e-6, one_is_zero=True, bits=1,
            with_tokens=True):
    """The solution with one slip, a keyword away from its default."""
    def slipped(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
        if world == 1 and one_is_zero:
            return 0.0
        message = (tokens if with_tokens else 1) * hidden * bytes_per_value * bits
        return per_layer * layers * (latency_us * latency + ring(world) * message / (gb_per_s * gb))
    return slipped


def cost_from_the_package(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
    """The right numbers, from the package's link_arithmetic."""
    if world == 1:
        return 0.0
    config = types.SimpleNamespace(hidden_size=tokens * hidden * bytes_per_value / 4)    # it counts 4-byte values
    result = {"degrees": {world: {"all_reduces_per_step": 2 * layers, "decode_tokens_per_s": 1.0}}}
    links = {"link": {"gb_per_s": gb_per_s, "latency_us": latency_us}}
    return link_arithmetic(result, config, links)[0]["seconds_per_step"]


def cost_by_the_explorer(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
    """The right numbers, from the explorer's copy of the formula."""
    return all_reduce_seconds(layers, hidden, tokens, world, gb_per_s, latency_us, bytes_per_value)


def cost_by_default(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us,
                    _seconds=reference_all_reduce_seconds):
    return _seconds(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us)


def _closure_over_the_explorer():
    explorer = all_reduce_seconds

    def cost(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
        return explorer(layers, hidden, tokens, world, gb_per_s, latency_us, bytes_per_value)
    return cost


def _the_checkers_slip():
    return tensor_parallel._slip()                                    # its slip with every default: the formula


def cost_by_a_helper(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
    return _the_checkers_slip()(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us)


def cost_by_a_built_name(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us):
    explorer = getattr(importlib.import_module("labsupport.explorers.tensor_parallel"), "all_reduce" + "_seconds")
    return explorer(layers, hidden, tokens, world, gb_per_s, latency_us, bytes_per_value)


# --- exercise 3: the goodput of a trace -----------------------------------------------------

def goodput(rows, ttft_slo, tpot_slo):
    """The notebook's solution."""
    met = sum(r["ttft"] <= ttft_slo and r["tpot"] <= tpot_slo for r in rows)
    return met / max(r["finished"] for r in rows)


def goodput_in_a_loop(rows, ttft_slo, tpot_slo):
    """Another right answer: a loop, the rows sorted by finish first (in place), an int 0 when none met."""
    rows.sort(key=lambda r: r["finished"])
    met = 0
    for row in rows:
        if row["ttft"] <= ttft_slo and row["tpot"] <= tpot_slo:
            met += 1
    return met / rows[-1]["finished"] if met else 0


def rate(meets=lambda r, a, b: r["ttft"] <= a and r["tpot"] <= b, span=lambda rows: max(r["finished"] for r in rows)):
    """The solution with one slip, a keyword away from its default."""
    def slipped(rows, ttft_slo, tpot_slo):
        return sum(1 for r in rows if meets(r, ttft_slo, tpot_slo)) / span(rows)
    return slipped


def goodput_as_a_dict(rows, ttft_slo, tpot_slo):
    met = sum(r["ttft"] <= ttft_slo and r["tpot"] <= tpot_slo for r in rows)
    return {"goodput": met / max(r["finished"] for r in rows), "met": met / len(rows)}


def goodput_from_the_package(rows, ttft_slo, tpot_slo):
    """The right numbers, from the package's goodput."""
    return tensor_parallel_disaggregated.goodput(rows, ttft_slo, tpot_slo)["goodput"]


def goodput_by_default(rows, ttft_slo, tpot_slo, _goodput=serving_metrics.goodput):
    return _goodput(rows, ttft_slo, tpot_slo)["goodput"]


def _closure_over_the_reference():
    reference = reference_goodput

    def goodput(rows, ttft_slo, tpot_slo):
        return reference(rows, ttft_slo, tpot_slo)
    return goodput


def _rate_of(rows, ttft_slo, tpot_slo):
    return tensor_parallel_goodput._slip()(rows, ttft_slo, tpot_slo)    # its slip with every default: goodput


def goodput_by_a_helper(rows, ttft_slo, tpot_slo):
    return _rate_of(rows, ttft_slo, tpot_slo)


def goodput_by_a_built_name(rows, ttft_slo, tpot_slo):
    metrics = importlib.import_module("labsupport.lab.serving_metrics")
    return getattr(metrics, "good" + "put")(rows, ttft_slo, tpot_slo)["goodput"]



NOTEBOOK_10 = [
    accepts(check_mlp_split, "reference", mlp_on_rank),
    accepts(check_mlp_split, "chunks-a-helper-and-F.linear", mlp_by_chunks),
    refuses(check_mlp_split, "no-all-reduce", "returned its own partial sum", no_all_reduce),
    refuses(check_mlp_split, "gate_up-cut-in-contiguous-halves", "rank 0 only gate rows", halves_of_gate_up),
    refuses(check_mlp_split, "rows-of-down", r"its columns, down_weight\[:, start:stop\]", rows_of_down),
    refuses(check_mlp_split, "all-reduce-of-h-before-down", "nothing to add before down", all_reduce_of_h),
    refuses(check_mlp_split, "whole-mlp-on-every-rank", "used weights outside its share: it computed the whole MLP",
            whole_mlp),
    refuses(check_mlp_split, "two-all-reduces", "one all-reduce per MLP", two_all_reduces),
    refuses(check_mlp_split, "divided-by-world", "do not divide it by world", divided_by_world),
    refuses(check_mlp_split, "interleaved-split", "not every world-th unit", interleaved),
    refuses(check_mlp_split, "the-packages-split", OWN + ".*plan_split", split_from_the_package),
    refuses(check_mlp_split, "shard_model-as-a-default", OWN + ".*shard_model", split_by_default),
    refuses(check_mlp_split, "the-engines-slices-through-a-helper", OWN + ".*_even_slices", split_by_a_helper),
    refuses(check_mlp_split, "the-checkers-candidates", OWN + ".*_candidates", split_by_the_checkers_candidates),
    refuses(check_mlp_split, "the-engines-slices-by-a-built-name", OWN + ".*_even_slices", split_by_a_built_name),
    accepts(check_all_reduce_cost, "reference", all_reduce_seconds_per_step),
    refuses(check_all_reduce_cost, "the-checkers-reference", OWN + ".*reference_all_reduce_seconds",
            reference_all_reduce_seconds),
    refuses(check_all_reduce_cost, "one-per-layer", "two all-reduces", seconds(per_layer=1)),
    refuses(check_all_reduce_cost, "no-ring-factor", "multiply the bytes by it", seconds(ring=lambda w: 1.0)),
    refuses(check_all_reduce_cost, "half-the-ring-factor", r"not \(world - 1\) / world",
            seconds(ring=lambda w: (w - 1) / w)),
    refuses(check_all_reduce_cost, "gib", "GiB", seconds(gb=2**30)),
    refuses(check_all_reduce_cost, "latency-in-ms", "reads it as ms", seconds(latency=1e-3)),
    refuses(check_all_reduce_cost, "latency-forgotten", "also costs its latency", seconds(latency=0.0)),
    refuses(check_all_reduce_cost, "world-1-not-zero", "return 0.0 when world == 1", seconds(one_is_zero=False)),
    refuses(check_all_reduce_cost, "bits", "that is bits", seconds(bits=8)),
    refuses(check_all_reduce_cost, "message-without-tokens", "every token's row", seconds(with_tokens=False)),
    refuses(check_all_reduce_cost, "world-1-none", "return 0.0", lambda *a: None if a[4] == 1 else 1.0),
    refuses(check_all_reduce_cost, "link_arithmetic", OWN + ".*link_arithmetic", cost_from_the_package),
    refuses(check_all_reduce_cost, "the-explorers-all_reduce_seconds",
            OWN + ".*explorers.tensor_parallel.all_reduce_seconds",
            cost_by_the_explorer),
    refuses(check_all_reduce_cost, "the-explorers-all_reduce_seconds-itself", OWN, all_reduce_seconds),
    refuses(check_all_reduce_cost, "the-checkers-reference-as-a-default", OWN, cost_by_default),
    refuses(check_all_reduce_cost, "the-explorers-copy-in-a-closure", OWN, _closure_over_the_explorer()),
    refuses(check_all_reduce_cost, "the-checkers-slip-through-a-helper", OWN + ".*_slip", cost_by_a_helper),
    refuses(check_all_reduce_cost, "the-explorers-copy-by-a-built-name", OWN, cost_by_a_built_name),
    accepts(check_goodput, "reference", goodput),
    accepts(check_goodput, "a-loop-over-rows-sorted-in-place", goodput_in_a_loop),
    refuses(check_goodput, "the-checkers-reference", OWN + ".*reference_goodput", reference_goodput),
    refuses(check_goodput, "either-objective", "meets both objectives: .* not or",
            rate(meets=lambda r, a, b: r["ttft"] <= a or r["tpot"] <= b)),
    refuses(check_goodput, "throughput", "that is the throughput", rate(meets=lambda r, a, b: True)),
    refuses(check_goodput, "the-share", "the share of the requests .* not a rate", rate(span=len)),
    refuses(check_goodput, "the-count", "that is how many requests met both", rate(span=lambda rows: 1)),
    refuses(check_goodput, "strict-less-than", "compare with <=, not <",
            rate(meets=lambda r, a, b: r["ttft"] < a and r["tpot"] < b)),
    refuses(check_goodput, "ttft-only", "keep its pace too", rate(meets=lambda r, a, b: r["ttft"] <= a)),
    refuses(check_goodput, "tpot-only", "first token on time too", rate(meets=lambda r, a, b: r["tpot"] <= b)),
    refuses(check_goodput, "objectives-swapped", "ttft with ttft_slo and its tpot with tpot_slo",
            rate(meets=lambda r, a, b: r["ttft"] <= b and r["tpot"] <= a)),
    refuses(check_goodput, "span-from-the-first-finish", "not at the first finish",
            rate(span=lambda rows: max(r["finished"] for r in rows) - min(r["finished"] for r in rows))),
    refuses(check_goodput, "span-from-the-last-row", "not of finish",
            rate(span=lambda rows: rows[-1]["finished"])),
    refuses(check_goodput, "span-as-the-sum-of-finishes", "adding up their durations",
            rate(span=lambda rows: sum(r["finished"] for r in rows))),
    refuses(check_goodput, "span-as-the-sum-of-durations", "adding up their durations",
            rate(span=lambda rows: sum(r["ttft"] + r["tpot"] * (len(r["tokens"]) - 1) for r in rows))),
    refuses(check_goodput, "a-dict", "not a dict", goodput_as_a_dict),
    refuses(check_goodput, "none", "as a number", lambda rows, ttft_slo, tpot_slo: None),
    refuses(check_goodput, "the-packages-goodput", OWN + ".*serving_metrics.goodput", goodput_from_the_package),
    refuses(check_goodput, "the-packages-goodput-itself", OWN, tensor_parallel_disaggregated.goodput),
    refuses(check_goodput, "the-packages-goodput-as-a-default", OWN, goodput_by_default),
    refuses(check_goodput, "the-checkers-reference-in-a-closure", OWN + ".*reference_goodput",
            _closure_over_the_reference()),
    refuses(check_goodput, "the-checkers-slip-through-a-helper", OWN + ".*_slip", goodput_by_a_helper),
    refuses(check_goodput, "the-packages-goodput-by-a-built-name", OWN, goodput_by_a_built_name),
]
