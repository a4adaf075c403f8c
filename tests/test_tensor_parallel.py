"""Tensor parallelism (notebook 10): the split covers every head and unit once, TP=2 gives TP=1's
logits and greedy tokens on two real processes over 127.0.0.1 (gloo), and every bad input or dying
rank ends in one sentence, never a hang."""

import os
import socket
import time

import pytest
import torch

from labsupport.engine.generation import generate
from labsupport.engine.config import PRESETS
from labsupport.engine.parallel import plan_split, run_tensor_parallel, shard_model
from labsupport.errors import LabError
from labsupport.weights.fixtures import random_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

PROMPT = torch.tensor([[1, 5, 9, 13, 200, 3, 77]])
UNEVEN = PRESETS["tiny-llama"].with_(hidden_size=48, num_heads=6, num_kv_heads=3, intermediate_size=130, name="tiny-uneven")


# --- functions the ranks run (importable by name: the ranks are spawned processes) ---------

def logits_and_tokens(model, rank, world, prompt):
    with torch.inference_mode():
        logits = model.logits(model(prompt))
    return logits, generate(model, prompt[0].tolist(), 6, eos_token_ids=()).tokens, model.config.num_kv_heads


def die_on_rank_one(model, rank, world):
    if rank == 1:
        os._exit(3)                                           # no word, no exception: the process is gone
    torch.distributed.barrier()                               # rank 0 waits for rank 1, which never comes


def raise_on_rank_one(model, rank, world):
    if rank == 1:
        raise ValueError("a learner's bug on rank 1")
    return rank


# --- the split ------------------------------------------------------------------------------

@pytest.mark.parametrize("config, world", [(PRESETS["smollm2-135m"], 2), (PRESETS["smollm2-135m"], 3),
                                           (PRESETS["tiny-llama"], 2), (UNEVEN, 2)])
def test_the_split_covers_every_head_unit_and_word_once(config, world):
    shares = plan_split(config, world)
    group = config.num_heads // config.num_kv_heads
    assert [h for s in shares for h in s.kv_heads] == list(range(config.num_kv_heads))
    assert [h for s in shares for h in s.q_heads] == list(range(config.num_heads))
    assert all(s.q_heads == range(s.kv_heads.start * group, s.kv_heads.stop * group) for s in shares)
    assert [u for s in shares for u in s.mlp_units] == list(range(config.intermediate_size))
    assert len({len(s.vocab) for s in shares}) == 1 and shares[-1].vocab.stop >= config.vocab_size
    assert max(len(s.kv_heads) for s in shares) - min(len(s.kv_heads) for s in shares) <= 1


def test_smollm2_135m_splits_unevenly_on_two_ranks():
    """9 query heads, 3 key/value heads: vLLM refuses TP=2; here ranks hold 2 and 1 whole groups."""
    shares = plan_split(PRESETS["smollm2-135m"], 2)
    assert [len(s.kv_heads) for s in shares] == [2, 1] and [len(s.q_heads) for s in shares] == [6, 3]
    assert [len(s.mlp_units) for s in shares] == [768, 768]


@pytest.mark.parametrize("world, words", [(0, "1 or more"), (-1, "1 or more"), (True, "whole number"),
                                          (1.5, "whole number"), (4, "at least 4 key/value heads")])
def test_a_degree_the_model_cannot_take_is_one_sentence(world, words):
    with pytest.raises(LabError, match=words):
        plan_split(PRESETS["smollm2-135m"], world)


def test_gpt2_is_refused_in_one_sentence():
    with pytest.raises(LabError, match="Llama-family"):
        plan_split(PRESETS["tiny-gpt2"], 2)


def test_one_rank_is_the_model_itself():
    model = random_model("tiny-llama")
    local = shard_model(model, 0, 1)
    with torch.inference_mode():
        assert torch.equal(local.logits(local(PROMPT)), model.logits(model(PROMPT)))
    assert local.embed is model.embed                                       # shared, not copied


def test_a_shard_of_two_outside_a_process_group_is_refused():
    with pytest.raises(LabError, match="run_tensor_parallel"):
        shard_model(random_model("tiny-llama"), 0, 2)


# --- two real ranks -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-llama", "uneven"])
def test_two_ranks_give_one_ranks_logits_and_greedy_tokens(name):
    model = random_model(UNEVEN if name == "uneven" else name)
    with torch.inference_mode():
        reference = model.logits(model(PROMPT))
    tokens = generate(model, PROMPT[0].tolist(), 6, eos_token_ids=()).tokens
    ranks = run_tensor_parallel(model, 2, logits_and_tokens, (PROMPT,), threads=1, timeout=120)
    assert len(ranks) == 2
    for logits, rank_tokens, _ in ranks:
        assert logits.shape == reference.shape
        torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)     # fp32 rounding only
        assert torch.equal(rank_tokens, tokens)
    assert [kv for _, _, kv in ranks] == [len(s.kv_heads) for s in plan_split(model.config, 2)]


def test_a_rank_that_dies_ends_the_group_in_one_sentence():
    started = time.monotonic()
    with pytest.raises(LabError, match=r"Rank 1 of 2 died \(exit code 3\)"):
        run_tensor_parallel(random_model("tiny-llama"), 2, die_on_rank_one, threads=1, timeout=60)
    assert time.monotonic() - started < 60                                     # seen by its exit code


def test_a_rank_that_raises_sends_its_sentence_back():
    with pytest.raises(LabError, match="Rank 1 of 2 failed: a learner's bug on rank 1"):
        run_tensor_parallel(random_model("tiny-llama"), 2, raise_on_rank_one, threads=1, timeout=60)


def test_code_read_from_standard_input_is_told_to_use_a_file_before_any_rank_starts(monkeypatch):
    """`python - <<EOF` used to end with "Rank 0 of 2 died (exit code 1)": each spawned rank runs
    the starting file again, and '<stdin>' is none."""
    import sys
    import types
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    started = []
    monkeypatch.setattr(torch.multiprocessing, "get_context", lambda *a: started.append(a))
    with pytest.raises(LabError, match=r"'<stdin>' is not a file \(Python read its code from standard "
                                       r"input\); save the code in a \.py file and run that"):
        run_tensor_parallel(random_model("tiny-llama"), 2, logits_and_tokens, (PROMPT,), timeout=30)
    assert started == []


def test_a_port_in_use_is_one_sentence():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LabError, match=f"Port {port} on 127.0.0.1 is in use"):
            run_tensor_parallel(random_model("tiny-llama"), 2, raise_on_rank_one, port=port)
    with pytest.raises(LabError, match="1024 to 65535"):
        run_tensor_parallel(random_model("tiny-llama"), 2, raise_on_rank_one, port=80)


def test_more_ranks_than_cores_is_one_sentence(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    with pytest.raises(LabError, match="2 ranks of 1 thread\\(s\\) need 2 cores; this machine has 1"):
        run_tensor_parallel(random_model("tiny-llama"), 2, raise_on_rank_one)
    with pytest.raises(LabError, match="threads"):
        run_tensor_parallel(random_model("tiny-llama"), 1, raise_on_rank_one, threads=0)


def test_the_measurement_runs_both_degrees_side_by_side_with_the_same_tokens():
    from labsupport.lab.tensor_parallel import link_arithmetic, measure_tensor_parallel
    model = random_model("tiny-llama")
    result = measure_tensor_parallel(model, [1, 2, 3, 4], degrees=(1, 2), cores=2, new_tokens=4,
                                     prefill_tokens=32, rounds=1, timeout=120)
    one, two = result["degrees"][1], result["degrees"][2]
    assert one["threads_per_rank"] == 2 and two["threads_per_rank"] == 1
    assert two["same_tokens"] and two["all_reduces_per_step"] == 2 * model.config.num_layers
    assert two["prefill_all_reduces"] == 2 * model.config.num_layers
    assert 0 < two["all_reduce_share_of_decode"] < 1 and two["all_reduce_latency"]["decode_row"]["median_s"] > 0
    assert [s["kv_heads"] for s in two["shares"]] == [1, 1]
    rows = link_arithmetic(result, model.config)
    assert {r["link"] for r in rows} == {"NVLink 4 (H100 SXM)", "PCIe 4.0 x16"}
    nvlink = next(r for r in rows if r["link"].startswith("NVLink"))
    assert nvlink["seconds_per_step"] == pytest.approx(2 * model.config.num_layers * (5e-6 + 64 * 4 / 450e9))   # 2 (w - 1) / w = 1
    with pytest.raises(LabError, match="cannot be shared evenly"):
        measure_tensor_parallel(model, [1, 2], degrees=(1, 2), cores=3)


def test_the_bench_section_writes_ratios_and_leaves_out_what_the_machine_cannot_run(monkeypatch):
    """`bench --sections tensor_parallel`: only when named; a degree the cores cannot take is left out
    with a sentence, not an error; two degrees give decode, prefill and all-reduce figures."""
    from labsupport.bench import tensor_parallel as section
    from labsupport.bench.suite import SECTIONS
    from labsupport.plots.sections import tensor_parallel_figures
    assert not SECTIONS["tensor_parallel"].in_default_run and SECTIONS["tensor_parallel"].notebook.startswith("10")

    class Tokenizer:                                      # bytes as token ids: tiny-llama's 260 words hold them
        def encode(self, text, add_special_tokens=True):
            return list(text.encode()[:24])

    class Context:
        def model(self, dtype):
            return random_model("tiny-llama"), Tokenizer()

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    out = section.section_tensor_parallel(Context(), section.TensorParallelOptions(
        degrees=(1, 2, 4), decode_tokens=4, prefill_tokens=32, rounds=1, disaggregation_rates=(20,),
        disaggregation_requests=3))
    assert out["left_out"] == [4] and "this machine has 2 core(s)" in out["left_out_note"]
    names = [f["name"] for f in out["figures"]]
    assert names[0] == "decode at batch 1, TP=2 / TP=1" and len(names) == 5
    assert names[-1] == "goodput at 20 requests/s, disaggregated / colocated"
    assert out["disaggregation"][20]["same_tokens"] and "rows" not in out["disaggregation"][20]["colocated"]
    import json
    from labsupport.claims import tensor_parallel_section_claims
    claims = tensor_parallel_section_claims(json.loads(json.dumps(out, default=str)))       # as the JSON holds it
    assert len(claims) == 6 and claims[-1]["claim"].startswith("(DistServe)")
    assert out["result"]["degrees"][2]["same_tokens"] and len(out["links"]) == 2
    assert len(tensor_parallel_figures(out)) == 1
    alone = section.section_tensor_parallel(Context(), section.TensorParallelOptions(degrees=(1, 4)))
    assert alone["result"] is None and alone["figures"] == [] and alone["left_out"] == [4]


def test_the_split_figure_draws_every_rank_in_every_matrix():
    from labsupport.plots.tensor_parallel import split_figure
    config = PRESETS["smollm2-135m"]
    fig = split_figure(config, plan_split(config, 2))
    assert len(fig.data) == 5 * 2
    widths = {}
    for bar in fig.data:
        widths.setdefault(bar.y[0], []).append(bar.x[0])
    assert all(abs(sum(w) - 1) < 1e-9 for w in widths.values())
    assert widths["qkv (column-parallel: queries, keys, values)"] == [6 / 9, 3 / 9]


def _result(tp_speed=10.0, same=True, decode_share=0.5, prefill_share=0.2, per_step=60.0):
    degree = {"decode_tokens_per_s": 20.0, "prefill_s": 0.6, "same_tokens": True, "all_reduces_per_step": 60.0,
              "prefill_all_reduces": 60, "all_reduce_share_of_decode": 0.0, "all_reduce_share_of_prefill": 0.0}
    tp = dict(degree, decode_tokens_per_s=tp_speed, same_tokens=same, all_reduce_share_of_decode=decode_share,
              all_reduce_share_of_prefill=prefill_share, all_reduces_per_step=per_step)
    return {"prefill_tokens": 512, "degrees": {1: degree, 2: tp}}


def test_the_claims_judge_what_was_measured_and_withhold_on_a_busy_machine():
    from labsupport.claims import tensor_parallel_claims, tensor_parallel_section_claims
    rows = tensor_parallel_claims(_result())
    assert [r["verdict"] for r in rows] == ["holds"] * 4
    assert "0.50x" in rows[2]["measured"] and "50% of a step" in rows[2]["measured"]
    wrong = tensor_parallel_claims(_result(tp_speed=30.0, same=False, decode_share=0.1, prefill_share=0.3,
                                           per_step=61.0))
    assert wrong[0]["verdict"] == "does not hold" and wrong[1]["verdict"] == "does not hold"
    assert wrong[2]["verdict"] == "not here: TP=2 decoded 1.50x faster"
    assert wrong[3]["verdict"] == "does not hold here"
    assert tensor_parallel_claims(_result(tp_speed=20.5))[2]["verdict"] == "holds: no measurable gain"
    busy = tensor_parallel_claims(_result(), busy="the load average was 3.0 per core")
    assert busy[0]["verdict"] == "holds" and busy[2]["verdict"].startswith("the machine was busy")
    assert tensor_parallel_section_claims({"result": None}) == []
    assert len(tensor_parallel_section_claims({"result": _result(), "load": 0.1})) == 4


def test_the_explorer_moves_the_balance_between_compute_and_communication():
    from labsupport.explorers.tensor_parallel import all_reduce_seconds, compute_seconds, measured_link, \
        tensor_parallel_explorer
    result = _result()
    result["degrees"][2]["all_reduce_latency"] = {"decode_row": {"bytes": 2304, "median_s": 2.5e-4},
                                                 "prefill": {"bytes": 2304 * 512, "median_s": 2.5e-4 + 0.01}}
    link = measured_link(result)
    assert link["latency_us"] == pytest.approx(250) and link["gb_per_s"] == pytest.approx(2304 * 511 / 0.01 / 1e9)
    assert compute_seconds(result, 1) == pytest.approx(1 / 20) and compute_seconds(result, 3) > compute_seconds(result, 1)
    assert all_reduce_seconds(30, 576, 1, 1, 25.0, 15.0) == 0.0
    assert all_reduce_seconds(30, 576, 1, 2, 25.0, 15.0) == pytest.approx(60 * (15e-6 + 2304 / 25e9))
    explorer = tensor_parallel_explorer(result, PRESETS["smollm2-135m"], use_widget=False)
    first = explorer.figures[0].figure
    explorer.controls["link"].value = "NVLink 4 (H100 SXM)"
    nvlink = explorer.figures[0].figure
    assert list(first.data[1].y)[0] == 0 and list(nvlink.data[1].y)[1] < list(first.data[1].y)[1]
    explorer.controls["tokens"].value = 2048
    assert list(explorer.figures[0].figure.data[0].y)[0] > list(nvlink.data[0].y)[0]
    assert "TP=2 takes" in explorer.figures[0].figure.layout.title.text


def test_the_ledger_says_where_tensor_parallelism_lost_and_why():
    from labsupport.claims.tensor_parallel import tensor_parallel_losses
    result = _result()
    result["degrees"][2]["prefill_s"] = 0.9
    result["degrees"][2]["shares"] = [{"kv_heads": 2}, {"kv_heads": 1}]
    lines = tensor_parallel_losses(result, [{"link": "NVLink 4 (H100 SXM)", "all_reduces_per_step": 60,
                                             "seconds_per_step": 3e-4, "share_of_measured_step": 0.004}])
    text = " ".join(lines)
    assert "0.50x TP=1's speed" in text and "50% of the step" in text and "ran at 0.67x" in text
    assert "split 2 + 1" in text and "0.4%" in text
    fast = _result(tp_speed=40.0)
    fast["degrees"][2]["prefill_s"] = 0.3
    fast["degrees"][2]["shares"] = [{"kv_heads": 1}, {"kv_heads": 1}]
    assert tensor_parallel_losses(fast, []) == ["Nothing measured here lost to its baseline."]


# --- issue 50: the launcher's and the split's arguments, each in one sentence ----------------

def raise_two_lines_on_rank_one(model, rank, world):
    if rank == 1:
        raise ValueError("the shapes do not match on rank 1\n  where: a learner's cell\n  hint: print the shapes")
    return rank


def test_a_ranks_error_of_many_lines_comes_back_as_one_line_naming_the_rank():
    with pytest.raises(LabError, match=r"^Rank 1 of 2 failed: the shapes do not match on rank 1\. The other ranks "
                                       r"were stopped\.$") as refused:
        run_tensor_parallel(random_model("tiny-llama"), 2, raise_two_lines_on_rank_one, threads=1, timeout=60)
    assert "\n" not in str(refused.value)


def _no_process(monkeypatch):
    started = []
    monkeypatch.setattr(torch.multiprocessing, "get_context", lambda *a: started.append(a))
    return started


@pytest.mark.parametrize("timeout", [float("nan"), 0, -1.0, True, float("inf"), "60", None, 10 ** 12])
def test_a_bad_timeout_is_one_sentence_before_any_rank_starts(monkeypatch, timeout):
    """Issue 50: the timeout was not checked (NaN, 0 or a bool reached the ranks and the timer)."""
    started = _no_process(monkeypatch)
    with pytest.raises(LabError, match="timeout") as refused:
        run_tensor_parallel(random_model("tiny-llama"), 2, raise_on_rank_one, timeout=timeout)
    assert "\n" not in str(refused.value) and started == []


def test_a_lambda_or_an_argument_that_cannot_be_pickled_is_one_sentence_before_any_rank_starts():
    """Issue 50: a pickling traceback. Spawning pickles in this process, before a child exists."""
    import multiprocessing
    import threading

    from labsupport.engine.parallel import run_ranks
    with pytest.raises(LabError, match=r"picklable .*pickle.*not a lambda") as refused:
        run_tensor_parallel(random_model("tiny-llama"), 2, lambda model, rank, world: rank, threads=1, timeout=30)
    assert "\n" not in str(refused.value)
    with pytest.raises(LabError, match=r"picklable .*\(TypeError: cannot pickle '_thread.lock' object\)"):
        run_ranks(2, raise_on_rank_one, (threading.Lock(),), threads=1, timeout=30)
    with pytest.raises(LabError, match="args must be a tuple"):
        run_ranks(2, raise_on_rank_one, 5, threads=1, timeout=30)
    with pytest.raises(LabError, match="fn must be a function"):
        run_ranks(2, "raise_on_rank_one", (), threads=1, timeout=30)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("rank, world", [(-1, 1), (1, 1), (5, 2), ("0", 1), (True, 1), (0.0, 1), (None, 1)])
def test_a_rank_outside_the_group_is_one_sentence(rank, world):
    """Issue 50: rank=-1 silently built the last rank's share; 5 gave an IndexError, "0" a TypeError."""
    with pytest.raises(LabError, match=r"rank \(one of the \d ranks\)") as refused:
        shard_model(random_model("tiny-llama"), rank, world)
    assert "\n" not in str(refused.value)
    with pytest.raises(LabError, match="degree"):
        shard_model(random_model("tiny-llama"), 0, 0)


def test_a_quantized_model_is_told_to_shard_the_float_model_first(monkeypatch):
    """Issue 50: an AttributeError ('Int8Linear' object has no attribute 'weight')."""
    from labsupport.engine.quant import quantize_model
    model = random_model("tiny-llama")
    handle = quantize_model(model, "int8", kernel="reference")
    with pytest.raises(LabError, match="shard the float model first"):
        shard_model(model, 0, 1)
    started = _no_process(monkeypatch)
    with pytest.raises(LabError, match="shard the float model first"):
        run_tensor_parallel(model, 2, logits_and_tokens, (PROMPT,), threads=1, timeout=30)
    assert started == []
    handle.restore()
    shard_model(model, 0, 1)                                # the float model splits again
    with pytest.raises(LabError, match="labsupport Transformer"):
        shard_model("a model", 0, 1)


# --- issue 51, item 5: GPU timings wait for the GPU; a GPU rank builds only its share ------------

class QueuedOnAGpu:
    """A stand-in for a CUDA tensor: what `device_clock` reads of one."""
    is_cuda, device = True, torch.device("cuda", 1)


def test_a_clock_read_waits_for_the_gpu_but_not_inside_a_graph_capture(monkeypatch):
    from labsupport.engine.parallel.tensor import device_clock
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    device_clock(QueuedOnAGpu())
    device_clock(torch.zeros(1))                                   # a CPU tensor: nothing to wait for
    assert waited == [torch.device("cuda", 1)]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    device_clock(QueuedOnAGpu())
    assert len(waited) == 1


def test_every_clock_read_of_the_measurement_waits_for_the_device(monkeypatch):
    """measure_rank times the prefill and each all-reduce probe with `device_clock`, never the bare host clock."""
    from labsupport.engine.parallel.tensor import Collectives
    from labsupport.lab import tensor_parallel
    reads = []

    def clock(tensor):
        reads.append(tensor.device)
        return time.perf_counter()
    monkeypatch.setattr(tensor_parallel, "device_clock", clock)
    model = shard_model(random_model("tiny-llama", seed=0), 0, 1, Collectives())
    tensor_parallel.measure_rank(model, 0, 1, [1, 2, 3], new_tokens=3, prefill_tokens=8, probe_calls=10)
    assert len(reads) == 2 + 2 * (10 + 5)                          # prefill, then 10 + 5 probes, each twice


def test_a_gpu_model_reaches_the_ranks_as_host_weights_and_each_rank_keeps_only_its_share(monkeypatch):
    import weakref
    from labsupport.engine.models.transformer import Transformer
    from labsupport.engine.parallel import launch
    model = random_model("tiny-llama", seed=0)
    assert launch.model_payload(model) == ("model", model)          # CPU: shared memory, no copy

    class OnAGpu:
        device, config, dtype = torch.device("cuda"), model.config, model.dtype

        def state_dict(self):
            return model.state_dict()
    kind, config, dtype, weights = launch.model_payload(OnAGpu())
    assert kind == "weights" and all(t.device.type == "cpu" for t in weights.values())

    built, asked = [], []
    real = Transformer.from_state_dict.__func__

    def on_the_cpu(cls, config, state, device="cpu", dtype=torch.float32):
        asked.append(device)
        whole = real(cls, config, state, device="cpu", dtype=dtype)
        built.append(weakref.ref(whole))
        return whole
    monkeypatch.setattr(Transformer, "from_state_dict", classmethod(on_the_cpu))
    share = launch.rank_share(0, 1, (kind, config, dtype, weights))     # one rank: no process group here
    assert asked == ["cuda:0"]                                      # built on the rank's own GPU
    assert built[0]() is None                                       # the whole model is gone
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(share.logits(share(ids)), model.logits(model(ids)))
