"""Checkers for notebook 10 (past one device): one MLP split across two real ranks (exercise 1) and
the seconds a forward pass spends in all-reduces (exercise 2).

`check_mlp_split` runs `mlp_on_rank` on two spawned processes in a gloo group (`run_ranks`), sent as source
with its helpers (a notebook's function cannot be imported there), each rank's weights NaN outside its share;
a slip is named from what the ranks sent and returned, and from probes with an all-reduce that sums nothing.
Both grade by reach (`grading.graded`), the split on each rank too: the function a rank builds from the
source is walked there, and the package's split is a refusing stand-in while it runs.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import re
import textwrap
import time

import torch
import torch.nn.functional as F

from ..engine import parallel
from ..errors import LabError
from . import CheckFailed, call_learner, close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded

MLP = "one MLP split across two ranks"
COST = "the seconds in all-reduces per forward pass"
WORLD = 2
TIMEOUT_S = 60.0                      # the whole run, and each collective: a rank left waiting ends there
ENGINE = "labsupport.engine."
MLP_EXERCISE = Exercise(
    title=MLP, teaches="one rank's share of a SwiGLU MLP: the gate and up rows and the down columns of its units, "
                       "and one all-reduce of its partial sum",
    computed_by=tuple(ENGINE + p for p in ("parallel.tensor.plan_split", "parallel.tensor.shard_model",
                                           "parallel.tensor._even_slices", "parallel.tensor._rows",
                                           "parallel.tensor.AllReduceOutput", "parallel.launch.run_tensor_parallel",
                                           "models.transformer.SwiGLU")))
COST_EXERCISE = Exercise(title=COST, teaches="the seconds one forward pass spends in all-reduces: two per layer, each "
                                             "a latency plus a ring's 2 (world - 1) / world of the message")
SIZES = [(3, 40, 96), (1, 24, 64)]    # (T, hidden, inner): hidden is neither inner nor a rank's units

RECIPE = ("take the gate rows start:stop and the up rows inner + start : inner + stop of gate_up_weight and the "
          "columns start:stop of down_weight, h = F.silu(x @ gate.T) * (x @ up.T), and return all_reduce(h @ down.T).")
SHAPES = ("x is (T, hidden); gate and up are (units, hidden), rows of gate_up_weight; down_weight is (hidden, inner), "
          "and a rank's share of it is its columns, down_weight[:, start:stop], which read its units.")
OUTSIDE = "rank {rank} used weights outside its share: "
HALVES = (OUTSIDE + "gate_up_weight holds all the gate rows, then all the up rows, so cutting it into contiguous "
          "halves gives rank 0 only gate rows and rank 1 only up rows; take the gate rows of your units (start:stop) "
          "and the up rows of the same units (inner + start : inner + stop).")
INTERLEAVED = (OUTSIDE + "a rank's units are one contiguous slice, from rank * inner // world to (rank + 1) * inner "
               "// world, not every world-th unit (rank, rank + world, ...).")
WHOLE = (OUTSIDE + "it computed the whole MLP, the right numbers by the wrong method. A rank holds only the gate and "
         "up rows of its own units and the columns of down that read them; the all-reduce adds the partial sums.")
READ = (OUTSIDE + "it read {read} of the other rank's units. Each rank holds only the gate rows and up rows of its "
        "own units and the columns of down_weight that read them.")
H_REDUCED = ("h holds each rank's own units, different ones, so there is nothing to add before down: multiply h by "
             "your columns of down first, then all-reduce that (T, hidden) partial sum.")
NO_ALL_REDUCE = ("rank {rank} returned {what}, one share of the answer: pass it to all_reduce, which adds every "
                 "rank's partial sum in place, and return the sum.")
TWO = ("one all-reduce per MLP: the first already leaves the sum on every rank, and a second adds world copies of "
       "it. Call all_reduce once, on the (T, hidden) partial sum after down.")
DIVIDED = ("all_reduce returns the sum of the ranks' partial sums, which is already the whole output: do not divide "
           "it by world (it is a sum, not a mean).")
WAITED = ("the ranks waited on each other until stopped: every rank must call all_reduce the same number of times, "
          "on tensors of the same shape.")
FRESH = ("your function runs in a fresh process on each rank, with torch, F and the functions and modules it uses, "
         "but not the notebook's other variables: keep what it needs inside it.")

# --- on each rank ----------------------------------------------------------------------------------

def _masked(gate_up, down, rank, world, regions=("gate", "up", "down")):
    """Copies of the weights with the entries of the other ranks' units in `regions` set to NaN."""
    inner = down.shape[1]
    outside = torch.arange(inner) // (inner // world) != rank                 # inner divides by world
    gate_up, down = gate_up.clone(), down.clone()
    gate_up[:inner][outside & ("gate" in regions)] = float("nan")
    gate_up[inner:][outside & ("up" in regions)] = float("nan")
    down[:, outside & ("down" in regions)] = float("nan")
    return gate_up, down


def _call(fn, case, gate_up, down, rank, world, sent, real):
    """fn on this rank; each all-reduce it makes is recorded in `sent`, and sums over the ranks if `real`."""
    original = torch.distributed.all_reduce

    def counted(tensor, *args, **kwargs):
        sent.append(tensor.detach().clone())
        if not real:
            return None                                       # a sum over nobody: the tensor stays
        work = tensor.contiguous()                                # the tensor itself when it is contiguous
        try:
            result = original(work, *args, **kwargs)
        except Exception as error:                                # noqa: BLE001 - the other rank failed, or left
            time.sleep(2.0)                                       # its own error, the cause, reaches the parent first
            raise RuntimeError(f"PEER|{type(error).__name__}|{error}") from None
        tensor.copy_(work)
        return result

    def all_reduce(tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce takes a tensor, got {type(tensor).__name__}")
        torch.distributed.all_reduce(tensor)
        return tensor

    torch.distributed.all_reduce = counted
    try:
        out = fn(case["x"].clone(), gate_up, down, rank, world, all_reduce)
    finally:
        torch.distributed.all_reduce = original
    return out.detach().clone() if isinstance(out, torch.Tensor) else repr(out)[:80]


def _mlp_rank(rank, world, program, name, cases):
    """One rank of `check_mlp_split`: the learner's function built from its source, graded by reach here too."""
    namespace = {"__name__": "__learner__", "torch": torch, "F": F}
    try:
        exec(compile(program, "<your function>", "exec"), namespace)       # noqa: S102 - the learner's own code
        fn = namespace[name]
    except Exception as error:                                              # noqa: BLE001
        raise RuntimeError(f"SOURCE|{type(error).__name__}|{error}") from None
    try:
        return graded(MLP_EXERCISE)(_rank_cases)(fn, rank, world, cases)
    except CheckFailed as refused:                                          # the package's split, reached or called
        raise RuntimeError(f"REFUSED||{refused}") from None


def _rank_cases(fn, rank, world, cases):
    """Each case with NaN outside this rank's share, then the probes that name a slip."""
    results = []
    for case in cases:
        sent = []
        try:
            out = _call(fn, case, *_masked(case["gate_up"], case["down"], rank, world), rank, world, sent, True)
        except Exception as error:                                          # noqa: BLE001
            if str(error).startswith("PEER|"):
                raise
            raise RuntimeError(f"LEARNER|{type(error).__name__}|{error}") from None
        result = {"out": out, "sent": sent, "probe_sent": [], "probe_out": None, "reads": []}
        try:
            result["probe_out"] = _call(fn, case, case["gate_up"].clone(), case["down"].clone(), rank, world,
                                        result["probe_sent"], False)
            for region in ("gate", "up", "down"):
                probe = _call(fn, case, *_masked(case["gate_up"], case["down"], rank, world, (region,)), rank,
                              world, [], False)
                if not isinstance(probe, torch.Tensor) or probe.isnan().any():
                    result["reads"].append(region)
        except Exception:                                                   # noqa: BLE001 - a probe only names a slip
            pass
        results.append(result)
    return results

# --- in the learner's process ----------------------------------------------------------------------

def _names_of(code) -> set[str]:
    return set(code.co_names).union(*(_names_of(c) for c in code.co_consts if inspect.iscode(c)))


def _shipped(fn) -> str:
    """The source a rank runs: fn's, its helpers', and imports for the modules and callables they use."""
    sources, imports, seen = [], [], set()

    def visit(function) -> None:
        if function in seen:
            return
        seen.add(function)
        names = _names_of(function.__code__)
        for name in sorted(names):
            value = function.__globals__.get(name)
            if inspect.ismodule(value):
                imports.append(f"import {value.__name__} as {name}")
            elif inspect.isfunction(value) and value.__module__ == fn.__module__:
                visit(value)
            elif callable(value) and _importable(value):
                imports.append(f"from {value.__module__} import {value.__qualname__} as {name}")
        try:
            sources.append(textwrap.dedent(inspect.getsource(function)))
        except (OSError, TypeError):
            if function is fn:                                    # a helper without source: a NameError there
                raise

    visit(fn)
    return "\n".join([*dict.fromkeys(imports), *sources])


def _importable(value) -> bool:
    module, qualname = getattr(value, "__module__", None), str(getattr(value, "__qualname__", ""))
    try:
        return (bool(module) and module != "__main__" and qualname.isidentifier()
                and getattr(importlib.import_module(module), qualname, None) is value)
    except Exception:                                                       # noqa: BLE001
        return False


def _mlp_cases() -> list[dict]:
    generator = torch.Generator().manual_seed(10)
    draw = lambda *shape, scale=1.0: torch.randn(*shape, generator=generator) * scale      # noqa: E731
    return [{"x": draw(tokens, hidden), "gate_up": draw(2 * inner, hidden, scale=hidden ** -0.5),
             "down": draw(hidden, inner, scale=inner ** -0.5)} for tokens, hidden, inner in SIZES]


def _candidates(case, rank, world=WORLD) -> dict:
    """This rank's numbers, right and for each slip, from the whole weights."""
    x, gate_up, down, inner = case["x"], case["gate_up"], case["down"], case["down"].shape[1]
    mine, every = slice(rank * inner // world, (rank + 1) * inner // world), slice(rank, inner, world)
    swiglu = lambda gate, up, down: (F.silu(x @ gate.T) * (x @ up.T)) @ down.T               # noqa: E731
    gate, up, halves = gate_up[:inner], gate_up[inner:], gate_up[2 * mine.start:2 * mine.stop].chunk(2)
    h = F.silu(x @ gate[mine].T) * (x @ up[mine].T)
    return {"whole": swiglu(gate, up, down), "h": h, "partial": h @ down[:, mine].T,
            "halves": swiglu(*halves, down[:, mine]), "interleaved": swiglu(gate[every], up[every], down[:, every])}


def _same(got, want) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5))


def _diagnose(case, rank, result) -> str:
    """The hint for a rank whose output is wrong: the slip its numbers match, else a rule."""
    want = _candidates(case, rank)
    probe = result["probe_sent"][0] if result["probe_sent"] else result["probe_out"]
    out, calls = result["out"], len(result["sent"])
    for slip, hint in (("halves", HALVES), ("interleaved", INTERLEAVED), ("whole", WHOLE)):
        if _same(probe, want[slip]):
            return hint.format(rank=rank)
    if _same(probe, want["h"]) or (result["sent"] and _same(result["sent"][0], want["h"])):
        return H_REDUCED
    if out.isnan().any():
        regions = {"gate": "the gate rows", "up": "the up rows", "down": "the columns of down"}
        return READ.format(rank=rank, read=" and ".join(regions[r] for r in result["reads"]) or "weights")
    if calls == 0:
        what = "its own partial sum" if _same(out, want["partial"]) else "what it computed without an all-reduce"
        return NO_ALL_REDUCE.format(rank=rank, what=what)
    if calls > 1:
        return TWO
    if _same(out * WORLD, want["whole"]):
        return DIVIDED
    return RECIPE[0].upper() + RECIPE[1:]


def _judge(case, results) -> None:
    """CheckFailed for the first rank whose output is not the whole MLP's, made with one all-reduce."""
    (tokens, hidden), inner = case["x"].shape, case["down"].shape[1]
    about = f"T={tokens}, hidden={hidden}, inner={inner}"
    for rank, result in enumerate(results):
        out, calls = result["out"], len(result["sent"])
        if not isinstance(out, torch.Tensor):
            fail(MLP, f"a ({tokens}, {hidden}) tensor on rank {rank} ({about})", out,
                 "return what all_reduce returns: the sum of the ranks' partial sums.")
        if tuple(out.shape) != (tokens, hidden):
            hint = ("that is h, before the down projection: multiply it by your columns of down, then all-reduce."
                    if tuple(out.shape) == (tokens, inner // WORLD) else SHAPES)
            fail(MLP, f"shape ({tokens}, {hidden}) on rank {rank} ({about})", f"shape {tuple(out.shape)}", hint)
        want = _candidates(case, rank)["whole"]
        if _same(out, want) and calls == 1:
            continue
        got = ("NaN" if out.isnan().any() else
               f"a largest difference of {float((out.double() - want.double()).abs().max()):.3g}")
        fail(MLP, f"the whole MLP's output on rank {rank} ({about}) from one all-reduce",
             f"{got} after {calls} all-reduce(s)", _diagnose(case, rank, result))


def _rank_failed(error: LabError) -> None:
    """CheckFailed (or the learner's NotImplementedError) for a run that ended in an error."""
    text = str(error)
    found = re.search(r"Rank (\d+) of \d+ failed: (LEARNER|SOURCE|REFUSED|PEER)\|([^|]*)\|(.*?)\.? The other ranks "
                      r"were stopped\.$", text, re.DOTALL)
    if found is None:
        if "did not finish" in text:
            fail(MLP, "both ranks to finish", text.rstrip("."), WAITED)
        raise error
    rank, kind, name, message = found.groups()
    if kind == "REFUSED":
        raise CheckFailed(message + ".") from None
    if name == "NotImplementedError":
        raise NotImplementedError(message or "mlp_on_rank is not written yet") from None
    if kind == "PEER":
        fail(MLP, "both ranks to finish", f"rank {rank} left waiting in an all-reduce", WAITED)
    said = " ".join(f"{name} on rank {rank}: {message}".split())[:200]
    hint = (FRESH if kind == "SOURCE" or name == "NameError" else
            SHAPES if re.search(r"shape|size|dimension|mat1|mat2", message) else
            WAITED if re.search(r"timed out|timeout|connection|peer", message, re.IGNORECASE) else
            "the error is in your function: try it on one rank, mlp_on_rank(x, gate_up, down, 0, 2, lambda t: t); "
            + RECIPE)
    fail(MLP, f"rank {rank}'s share of the MLP", said, hint)


@grades_quietly
@graded(MLP_EXERCISE)
def check_mlp_split(fn) -> None:
    """Check `fn(x, gate_up_weight, down_weight, rank, world, all_reduce)` on two real ranks. Notebook 10
    (past one device), exercise 1. Each rank gets the weights with NaN outside its share and an all_reduce
    that counts its calls; each must return F.silu(x @ G.T) * (x @ U.T) @ D.T after one all-reduce. A
    function that reaches or calls the package's split (plan_split, shard_model, ...) is refused, here and
    on each rank (`MLP_EXERCISE`)."""
    if not inspect.isfunction(fn) or fn.__name__ == "<lambda>":
        fail(MLP, "a function defined with def", repr(fn)[:60],
             "define mlp_on_rank with def in a cell: the checker sends its source to the ranks.")
    try:
        inspect.signature(fn).bind(*range(6))
        program = _shipped(fn)
    except TypeError:
        fail(MLP, "mlp_on_rank(x, gate_up_weight, down_weight, rank, world, all_reduce)",
             f"{fn.__name__}{inspect.signature(fn)}", "keep the six arguments of the exercise, in that order.")
    except OSError:
        fail(MLP, "a function whose source can be read", "none", "define mlp_on_rank with def in a notebook cell.")
    cases = _mlp_cases()
    try:
        ranks = parallel.run_ranks(WORLD, _mlp_rank, (program, fn.__name__, cases), threads=1, timeout=TIMEOUT_S)
    except LabError as error:
        _rank_failed(error)
    for index, case in enumerate(cases):
        _judge(case, [ranks[rank][index] for rank in range(WORLD)])
    passed(MLP, "Each rank read only its share of gate_up and down. Two all-reduces per layer (after attention, after "
                "the MLP) buy this: each rank holds and reads only 1/world of every layer's weights.")

# --- exercise 2: the seconds in all-reduces ----------------------------------------------------------

def reference_all_reduce_seconds(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us) -> float:
    """Seconds one forward pass spends in all-reduces under tensor parallelism: two per layer, each a latency
    plus a ring's 2 (world - 1) / world of the message over the link; 0 on one rank.
    Notebook 10 (past one device), exercise 2."""
    if world == 1:
        return 0.0
    message = tokens * hidden * bytes_per_value
    return 2 * layers * (latency_us * 1e-6 + 2 * (world - 1) / world * message / (gb_per_s * 1e9))


def _slip(per_layer=2, ring=lambda w: 2 * (w - 1) / w, gb=1e9, latency=1e-6, zero_at_1=True, bits=1, tokens=True,
          latencies=lambda w: 1):
    def seconds(layers, hidden, n, bytes_per_value, world, gb_per_s, latency_us):
        if world == 1 and zero_at_1:
            return 0.0
        message = (n if tokens else 1) * hidden * bytes_per_value * bits
        return per_layer * layers * (latencies(world) * latency_us * latency + ring(world) * message / (gb_per_s * gb))
    return seconds


BITS = "the message is tokens x hidden x bytes_per_value bytes and gb_per_s is in bytes: no factor 8 (that is bits)."
COST_SLIPS = [
    (_slip(per_layer=1), "a layer makes two all-reduces, one after attention and one after the MLP: 2 x layers."),
    (_slip(ring=lambda w: 1.0), "a ring all-reduce moves 2 (world - 1) / world of the message through each link "
                                "(a reduce-scatter, then an all-gather): multiply the bytes by it."),
    (_slip(ring=lambda w: (w - 1) / w), "a ring all-reduce moves 2 (world - 1) / world of the message, not (world - "
                                        "1) / world: a reduce-scatter and an all-gather, (world - 1) / world each."),
    (_slip(gb=2**30), "a GB is 10**9 bytes (a GiB, 2**30, is 7% more): gb_per_s x 1e9 bytes per second."),
    (_slip(gb=1.0), "gb_per_s is in GB per second: multiply it by 1e9 for bytes per second."),
    (_slip(latency=1e-3), "latency_us is in microseconds: x 1e-6 for seconds, not 1e-3 (that reads it as ms)."),
    (_slip(latency=1.0), "latency_us is in microseconds: multiply it by 1e-6 for seconds."),
    (_slip(latency=0.0), "each all-reduce also costs its latency, latency_us x 1e-6 s, however small the message."),
    (_slip(latencies=lambda w: 2 * (w - 1)), "that is the textbook ring, which charges the latency at each of its 2 "
     "(world - 1) steps; this exercise charges one effective latency per all-reduce, as its text says: "
     "latency_us x 1e-6 once per all-reduce."),
    (_slip(zero_at_1=False), "with one rank there is nothing to reduce: return 0.0 when world == 1."),
    (_slip(bits=8.0), BITS), (_slip(bits=1 / 8), BITS),
    (_slip(tokens=False), "each all-reduce carries every token's row: tokens x hidden x bytes_per_value bytes."),
]

COST_CASES = [(30, 576, 1, 4, 2, 450.0, 5.0), (30, 576, 512, 4, 4, 450.0, 5.0), (30, 576, 512, 4, 2, 25.0, 15.0),
              (30, 576, 1, 4, 8, 25.0, 15.0), (30, 576, 1, 4, 1, 450.0, 5.0), (24, 2048, 512, 2, 8, 450.0, 5.0),
              (24, 2048, 1, 2, 4, 25.0, 15.0), (24, 2048, 512, 2, 1, 25.0, 15.0)]
ARGUMENTS = ("layers", "hidden", "tokens", "bytes_per_value", "world", "gb_per_s", "latency_us")


def _cost_hint(got: list[float], index: int) -> str:
    """The slip whose values are all of `got`, else the slip that gives got[index] there, else the rule."""
    everywhere = [h for s, h in COST_SLIPS if all(close_enough(g, s(*c)) for g, c in zip(got, COST_CASES))]
    there = [h for s, h in COST_SLIPS if close_enough(got[index], s(*COST_CASES[index]))]
    return (everywhere or there or ["2 x layers x (latency_us x 1e-6 + 2 (world - 1) / world x tokens x hidden x "
                                    "bytes_per_value / (gb_per_s x 1e9)), and 0.0 when world == 1."])[0]


def _about(case) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in zip(ARGUMENTS, case))


@grades_quietly
@graded(COST_EXERCISE)
def check_all_reduce_cost(fn) -> None:
    """Check `fn(layers, hidden, tokens, bytes_per_value, world, gb_per_s, latency_us) -> seconds`. Notebook 10
    (past one device), exercise 2. Exact (to 1e-6) on worlds 1, 2, 4, 8, 1 and 512 tokens, two links, with a
    hint for each usual slip; a function that reaches the package's copies of the formula (`link_arithmetic`,
    the explorer's `all_reduce_seconds`, this module's reference) is refused (`COST_EXERCISE`)."""
    got = []
    for case in COST_CASES:
        value = call_learner(COST, "seconds", f"your function raised an error on ({_about(case)}).", fn, *case)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            hint = ("with one rank there is nothing to reduce: return 0.0." if case[4] == 1 and value is None
                    else "return the seconds as a float.")
            fail(COST, f"seconds for ({_about(case)})", repr(value)[:60], hint)
        got.append(float(value))
    for index, (case, value) in enumerate(zip(COST_CASES, got)):
        want = reference_all_reduce_seconds(*case)
        if not close_enough(value, want):
            fail(COST, f"{want:.6g} s for ({_about(case)})", f"{value:.6g}", _cost_hint(got, index))
    decode, prefill = (reference_all_reduce_seconds(30, 576, n, 4, 2, 450.0, 5.0) for n in (1, 512))
    passed(COST, f"SmolLM2-135M on two ranks over NVLink: {decode * 1e6:.0f} us per decode step, almost all "
                 f"latency; {prefill * 1e6:.0f} us for a 512-token prefill, where the bytes start to count.")

