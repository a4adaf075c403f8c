"""Property-based pass over the public arguments of notebook 10's parallel code (issue 50):
`engine.parallel` (the launcher's checks, the split, a rank's share) and
`lab.tensor_parallel_disaggregated` (the workload's checks, the comparison's, goodput).

For arbitrary values (NaN, inf, negatives, bools, huge ints, wrong types, empty lists) each
public function either returns a correct result or raises a LabError of one line; never another
exception. No process starts inside a hypothesis loop: whatever would start one
(`torch.multiprocessing.get_context`, `run_ranks`, `run_tensor_parallel`, `serve_disaggregated`)
is replaced by a stand-in that raises `Reached`, so a value that passes every check ends there.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from labsupport.engine.config import PRESETS
from labsupport.engine.parallel import plan_split, run_ranks, run_tensor_parallel, shard_model
from labsupport.engine.parallel.launch import MAX_TIMEOUT_S, require_launch
from labsupport.engine.parallel.tensor import require_float_model
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.serving import Request
from labsupport.errors import LabError
from labsupport.lab import tensor_parallel, tensor_parallel_disaggregated
from labsupport.lab.serving_metrics import goodput

pytestmark = pytest.mark.platform    # reaches engine.parallel: a torch version can break it (tests/test_platform_marker.py)
from labsupport.lab.tensor_parallel_disaggregated import compare_with_colocated, require_workload, serve_disaggregated
from labsupport.weights.fixtures import random_model

torch.set_num_threads(1)
MODEL = random_model("tiny-llama")          # context 256, vocabulary 260, 2 key/value heads
REFUSED = object()


class Reached(Exception):
    """Raised by a stand-in for whatever would start a process: every check passed."""


def rank_fn(rank, world):
    """A function the ranks could run (importable by name)."""
    return rank


# floats holds NaN and both infinities; the ints stay below float's largest (2 ** 1024), since
# `inputs.finite_number` cannot take a larger int (OverflowError, outside this pass's files)
HUGE = st.integers(min_value=-(10 ** 300), max_value=10 ** 300)
ANY = st.one_of(st.none(), st.booleans(), HUGE, st.integers(-3, 5), st.floats(), st.text(max_size=4),
                st.lists(st.integers(-3, 5), max_size=3), st.just(()), st.just([]), st.just({}),
                st.just(object()), st.binary(max_size=2))


@st.composite
def arguments(draw, valid: dict, invalid: dict):
    """A valid value for each argument, then any few of them (often none) replaced by a value
    from `invalid` (the argument's own edge cases) or by anything at all (`ANY`): so both what
    passes and what is refused are reached."""
    values = {name: draw(strategy) for name, strategy in valid.items()}
    for name in draw(st.sets(st.sampled_from(sorted(valid)), max_size=2)):
        values[name] = draw(st.one_of(invalid[name], ANY) if name in invalid else ANY)
    return values


def edge(*values):
    return st.sampled_from(values)


NAN, INF = float("nan"), float("inf")


def outcome(call):
    """call()'s result, or REFUSED when it raised a LabError of one line; any other exception fails."""
    try:
        result = call()
    except LabError as error:
        message = str(error)
        assert message and "\n" not in message, repr(message)
        event("refused in one sentence")
        return REFUSED
    event("returned")                           # --hypothesis-show-statistics: both outcomes are reached
    return result


def reached_or_refused(call) -> bool:
    """True when call() got past every check to the stand-in, False when refused in one line."""
    try:
        result = outcome(call)
    except Reached:
        event("passed every check")
        return True
    assert result is REFUSED, result
    return False


# --- engine.parallel ---------------------------------------------------------------------------

LAUNCH = arguments(
    {"world": edge(1, 2), "fn": edge(rank_fn, print), "args": st.one_of(st.tuples(st.integers()), st.lists(HUGE)),
     "threads": st.just(1), "timeout": st.floats(1e-3, 1e6), "device": edge("cpu", "cpu:0")},
    {"world": edge(0, -1, 3, 10 ** 30, 2.0), "fn": edge("rank_fn", 3), "args": edge(5, "ab"),
     "threads": edge(0, -1, 3, 1.0), "timeout": edge(NAN, INF, -INF, 0, -1, 0.0, 1e300),
     "device": edge("cuda:7", "mps", "meta", "banana", "")})


@given(a=LAUNCH)
def test_the_launchers_checks_return_checked_values_or_one_sentence(a):
    result = outcome(lambda: require_launch(a["world"], a["fn"], a["args"], a["threads"], a["timeout"], a["device"]))
    if result is not REFUSED:
        device, args, timeout = result
        assert type(a["world"]) is int and 1 <= a["world"] * a["threads"] <= 2 and callable(a["fn"])
        assert device.type in ("cpu", "cuda") and args == tuple(a["args"])
        assert math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S and timeout == a["timeout"]


@given(a=LAUNCH, port=st.one_of(st.none(), st.none(), st.integers(-1, 70000), ANY))
def test_run_ranks_starts_nothing_it_should_refuse(a, port):
    with mock.patch.object(torch.multiprocessing, "get_context", side_effect=Reached):
        if reached_or_refused(lambda: run_ranks(a["world"], a["fn"], a["args"], threads=a["threads"], port=port,
                                                timeout=a["timeout"], device=a["device"])):
            require_launch(a["world"], a["fn"], a["args"], a["threads"], a["timeout"], a["device"])  # it passes them


@given(a=arguments({"model": st.just(MODEL), "world": edge(1, 2), "timeout": st.floats(1e-3, 1e6)},
                   {"model": edge("model", PRESETS["tiny-llama"]), "world": edge(0, 3, -1, True),
                    "timeout": edge(NAN, INF, 0, -1)}))
def test_run_tensor_parallel_starts_nothing_it_should_refuse(a):
    with mock.patch.object(torch.multiprocessing, "get_context", side_effect=Reached):
        if reached_or_refused(lambda: run_tensor_parallel(a["model"], a["world"], rank_fn, threads=1,
                                                          timeout=a["timeout"])):
            assert a["model"] is MODEL and a["world"] in (1, 2) and a["timeout"] > 0


CONFIGS = [PRESETS["tiny-llama"], PRESETS["smollm2-135m"], PRESETS["tiny-gpt2"]]


@given(a=arguments({"config": st.sampled_from(CONFIGS[:2]), "world": st.integers(1, 3)},
                   {"world": edge(0, -1, 10 ** 30, True, 2.0)}))
def test_the_split_covers_every_head_unit_and_word_once_or_is_refused(a):
    config, world = a["config"], a["world"]
    shares = outcome(lambda: plan_split(config, world))
    if shares is REFUSED:
        return
    assert len(shares) == world and config.family == "llama"
    for field, total in (("kv_heads", config.num_kv_heads), ("q_heads", config.num_heads),
                         ("mlp_units", config.intermediate_size)):
        assert [i for share in shares for i in getattr(share, field)] == list(range(total))
    assert all(len(share.kv_heads) >= 1 for share in shares)
    assert shares[-1].vocab.stop >= config.vocab_size


@given(a=arguments({"rank": st.just(0), "world": st.just(1)},
                   {"rank": edge(-1, 1, 5, True, 0.0), "world": edge(0, 2, -1, True)}))
def test_a_ranks_share_is_built_only_for_a_rank_of_the_group(a):
    local = outcome(lambda: shard_model(MODEL, a["rank"], a["world"]))
    if local is not REFUSED:                    # outside a process group only one rank of one can be built
        assert a["world"] == 1 and a["rank"] == 0 and type(a["rank"]) is int
        assert local.config.num_kv_heads == MODEL.config.num_kv_heads


@given(model=ANY)
def test_only_a_float_transformer_can_be_split(model):
    assert outcome(lambda: require_float_model(model)) is REFUSED
    assert outcome(lambda: require_float_model(MODEL)) is MODEL


# --- lab.tensor_parallel_disaggregated ------------------------------------------------------------

PROMPT = st.lists(st.integers(0, 259), min_size=1, max_size=6)
SAMPLING = edge(SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9, seed=3))
REQUEST = st.builds(Request, prompt=PROMPT, max_new_tokens=st.integers(2, 8), sampling=SAMPLING,
                    eos_token_ids=st.lists(st.integers(0, 300), max_size=2), arrival=st.floats(0, 2))
BAD_REQUEST = st.one_of(
    st.builds(Request, prompt=PROMPT, max_new_tokens=st.just(1)),
    st.builds(Request, prompt=st.lists(st.integers(0, 259), min_size=250, max_size=256),
              max_new_tokens=st.integers(2, 9)),
    st.builds(Request, prompt=st.lists(st.sampled_from([-1, 260, 10 ** 12]), min_size=1, max_size=2)),
    st.builds(Request, prompt=PROMPT, on_token=st.just(print)), st.builds(Request, prompt=PROMPT, logprobs=st.just(2)))
REQUESTS = st.one_of(st.lists(REQUEST, min_size=1, max_size=3), st.tuples(REQUEST))
BAD_REQUESTS = st.one_of(st.just([]), st.just(()), st.lists(BAD_REQUEST, min_size=1, max_size=2),
                         st.lists(ANY, min_size=1, max_size=2), REQUEST, PROMPT)


def servable(requests) -> bool:
    """What serve_disaggregated can serve on MODEL: Requests in its context and vocabulary, tokens only."""
    return isinstance(requests, (list, tuple)) and len(requests) > 0 and all(
        isinstance(r, Request) and 2 <= r.max_new_tokens and r.max_length <= 256 and 0 <= min(r.prompt)
        and max(r.prompt) < 260 and r.on_token is None and r.logprobs is None for r in requests)


@given(a=arguments({"model": st.just(MODEL), "requests": REQUESTS, "slots": st.integers(1, 5),
                    "block_size": st.integers(1, 256), "timeout": st.floats(1e-3, 1e6)},
                   {"model": edge("model", PRESETS["tiny-llama"]), "requests": BAD_REQUESTS,
                    "slots": edge(0, -1, True, 2.0), "block_size": edge(0, -1, 257, 10 ** 30, True),
                    "timeout": edge(NAN, INF, 0, -1, True)}))
def test_the_workload_is_checked_whole_before_any_process_starts(a):
    result = outcome(lambda: require_workload(a["model"], a["requests"], a["slots"], a["block_size"], a["timeout"]))
    if result is not REFUSED:
        requests, slots, block_size, timeout = result
        assert a["model"] is MODEL and servable(a["requests"]) and requests == list(a["requests"])
        assert type(a["slots"]) is int and slots == a["slots"] >= 1 and 1 <= block_size == a["block_size"] <= 256
        assert math.isfinite(timeout) and timeout > 0
    with mock.patch.object(tensor_parallel_disaggregated, "run_ranks", side_effect=Reached):
        reached = reached_or_refused(lambda: serve_disaggregated(a["model"], a["requests"], a["slots"],
                                                                 a["block_size"], a["timeout"]))
    assert reached == (result is not REFUSED)


@given(a=arguments({"requests": REQUESTS, "slots": st.integers(1, 3), "token_budget": st.one_of(st.none(),
                                                                                              st.integers(3, 40)),
                    "ttft_slo": st.floats(1e-3, 10), "tpot_slo": st.floats(1e-3, 10), "cores": st.integers(1, 2)},
                   {"requests": BAD_REQUESTS, "slots": edge(0, -1, True), "token_budget": edge(0, 2, -1, 1.5),
                    "ttft_slo": edge(NAN, INF, 0, -1), "tpot_slo": edge(NAN, -INF, 0.0, -1),
                    "cores": edge(0, 10 ** 6)}))
def test_the_comparison_serves_nothing_it_should_refuse(a):
    with mock.patch.object(tensor_parallel_disaggregated, "serve_disaggregated", side_effect=Reached):
        if reached_or_refused(lambda: compare_with_colocated(MODEL, a["requests"], a["slots"], a["token_budget"],
                                                             a["ttft_slo"], a["tpot_slo"], a["cores"])):
            assert servable(a["requests"]) and type(a["slots"]) is int and a["slots"] >= 1
            assert a["token_budget"] is None or a["token_budget"] >= a["slots"]
            assert math.isfinite(a["ttft_slo"] + a["tpot_slo"]) and a["ttft_slo"] > 0 and a["tpot_slo"] > 0
            assert type(a["cores"]) is int and a["cores"] >= 1


SECONDS = st.one_of(st.floats(0, 50), st.floats(0, 50), st.floats(), HUGE, st.booleans(), st.none(),
                    st.text(max_size=2))
ROW = st.fixed_dictionaries({"ttft": SECONDS, "tpot": SECONDS, "finished": SECONDS})
GOOD_ROW = st.fixed_dictionaries({"ttft": st.floats(0, 5), "tpot": st.floats(0, 1), "finished": st.floats(0.1, 50)})


@given(a=arguments({"rows": st.lists(GOOD_ROW, max_size=5), "ttft_slo": st.floats(1e-3, 5),
                    "tpot_slo": st.floats(1e-3, 1), "start": st.one_of(st.just(0.0), st.floats(-1, 0.05)),
                    "requests": st.one_of(st.none(), st.integers(5, 8))},
                   {"rows": st.one_of(st.lists(ROW, min_size=1, max_size=3), st.lists(ANY, min_size=1, max_size=2)),
                    "ttft_slo": edge(NAN, INF, 0, -1), "tpot_slo": edge(NAN, 0.0, -1e-9),
                    "start": edge(NAN, INF, 60.0, 1e9), "requests": edge(0, -1, 1, True, 2.5, NAN)}))
def test_goodput_is_the_rate_of_requests_that_met_both_objectives_or_one_sentence(a):
    rows, ttft_slo, tpot_slo, start, requests = a["rows"], a["ttft_slo"], a["tpot_slo"], a["start"], a["requests"]
    result = outcome(lambda: goodput(rows, ttft_slo, tpot_slo, start, requests))
    if result is REFUSED:
        return
    met = sum(r["ttft"] <= ttft_slo and r["tpot"] <= tpot_slo for r in rows)
    sent = len(rows) if requests is None else requests
    assert ttft_slo > 0 and tpot_slo > 0 and sent >= max(len(rows), 1)
    assert result["met"] == pytest.approx(met / sent)
    if rows:
        span = max(r["finished"] for r in rows) - start
        assert span > 0 and result["goodput"] == pytest.approx(met / span)
    else:
        assert result["goodput"] == 0.0                         # requests were sent and none came back


# --- lab.tensor_parallel ------------------------------------------------------------------------

@given(a=arguments({"prompt": PROMPT, "degrees": edge((1, 2), (2, 1), (1,), (2,), [1, 2]),
                    "cores": edge(None, 2), "new_tokens": st.integers(1, 64), "prefill_tokens": st.integers(1, 256),
                    "rounds": st.integers(1, 3)},
                   {"prompt": edge([], [-1], [260], "text", [[1], [2]]),
                    "degrees": edge((), (0,), (1, 1), (3,), (1, 3)),
                    "cores": edge(0, 3, -1, 10 ** 6), "new_tokens": edge(0, 255, 10 ** 9),
                    "prefill_tokens": edge(0, 257), "rounds": edge(0, -1, 1.0)}))
def test_the_measurement_starts_no_rank_it_should_refuse(a):
    values = [a[name] for name in ("prompt", "degrees", "cores", "new_tokens", "prefill_tokens", "rounds")]
    with mock.patch.object(tensor_parallel, "run_tensor_parallel", side_effect=Reached):
        if reached_or_refused(lambda: tensor_parallel.measure_tensor_parallel(MODEL, *values, timeout=30)):
            checked = tensor_parallel.require_measurement(MODEL, *values)
            ids, degrees, cores, new_tokens, prefill_tokens, rounds = checked
            assert all(0 <= t < 260 for t in ids) and set(degrees) <= {1, 2} and len(set(degrees)) == len(degrees)
            assert len(ids) + max(new_tokens, 4) <= 256 and 1 <= prefill_tokens <= 256 and rounds >= 1
            assert all(cores % world == 0 for world in degrees)
