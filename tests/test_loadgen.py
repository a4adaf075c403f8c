"""The load generator (notebook 09) against our server on 127.0.0.1, and the CLI's serve and loadgen.

Every load here is bounded (a handful of requests, a timeout on each) and ends by itself.
"""

import json
import math
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

from labsupport.engine.serving import Engine
from labsupport.errors import LabError
from labsupport.lab.http_serving_loadgen import (AGENT_REPLY, LoadRequest, LoadResult, agentic_workload, as_engine_requests,
                                   chat_workload, goodput, load_test,
                                    run_load, summarize_load)
from labsupport.lab.serving_workload import chat_prompts, make_workload
from labsupport.lab.workloads import CHAT_QUESTIONS
from labsupport.serve import BackgroundServer, create_app
from labsupport.weights.fixtures import ByteTokenizer, random_model


@pytest.fixture(scope="module")
def server():
    model = random_model("tiny-llama", dtype=torch.float64)
    app = create_app(model, ByteTokenizer(), "tiny", max_slots=2, max_waiting=2)
    with BackgroundServer(app) as running:
        running.app, running.model = app, model
        yield running


def test_the_workload_is_the_in_process_engines_workload():
    requests = chat_workload(10, rate=2.0, median_new_tokens=6, max_new_tokens=20, seed=4)
    assert [r.question for r in requests] == [CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)] for i in range(10)]
    tok = ByteTokenizer()
    engine_side = make_workload(chat_prompts(tok, 10), rate=2.0, median_new_tokens=6, max_new_tokens=20, seed=4)
    ours = as_engine_requests(tok, requests)
    assert [(r.prompt, r.max_new_tokens, r.arrival) for r in ours] == [
        (r.prompt, r.max_new_tokens, r.arrival) for r in engine_side]
    fixed = chat_workload(4, rate=2.0, fixed_rate=True)
    assert [r.arrival for r in fixed] == [0.0, 0.5, 1.0, 1.5]
    assert {r.arrival for r in chat_workload(3, rate=None)} == {0.0}


def test_a_load_test_measures_every_request_and_the_server_agrees(server):
    requests = chat_workload(6, rate=20.0, median_new_tokens=5, max_new_tokens=12, seed=1)
    figures = load_test(server.url, requests, timeout=30)
    assert figures["served"] == 6 and figures["errors"] == 0
    assert figures["tokens"] == sum(r.max_tokens for r in requests)             # ignore_eos honoured
    for row in figures["results"]:
        assert row["sent"] >= row["arrival"] - 1e-6 and row["chunk_times"] == sorted(row["chunk_times"])
        assert row["chunk_times"][0] > row["sent"]
    assert len(figures["results"][0]["chunk_times"]) == requests[0].max_tokens        # a chunk per token
    assert 0 < figures["ttft_p50"] <= figures["ttft_p99"] and figures["itl_p50"] > 0 and figures["throughput"] > 0
    json.dumps(figures)                                                          # JSON-ready
    completions = load_test(server.url, requests[:2], endpoint="completions", timeout=30)
    assert completions["served"] == 2
    server.app.state.engine.blocks.assert_no_leaks()
    # the in-process engine serves the same workload to the same tokens' count
    result = Engine(server.model, max_slots=2).run(as_engine_requests(ByteTokenizer(), requests))
    assert sum(len(t) for t in result.tokens().values()) == figures["tokens"]


def test_errors_are_counted_by_kind_not_raised(server):
    burst = [LoadRequest("Why?", 200, 0.0) for _ in range(8)]                   # 2 slots + 2 waiting
    figures = load_test(server.url, burst, timeout=30)
    assert figures["error_kinds"].get("429", 0) >= 4 and figures["served"] + figures["errors"] == 8
    wrong_model = summarize_load(run_load(server.url, burst[:1], model="nope", timeout=30))
    assert wrong_model["error_kinds"] == {"404": 1} and wrong_model["served"] == 0
    with socket.socket() as s:                                                   # a port with no server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nobody = summarize_load(run_load(f"http://127.0.0.1:{port}", burst[:1], model="x", timeout=5))
    assert nobody["error_kinds"] == {"ConnectError": 1}


def test_summaries_of_hand_made_results():
    results = [LoadResult(arrival=0, sent=0.0, chunk_times=[0.5, 0.6, 0.8], tokens=3),
               LoadResult(arrival=0, sent=0.1, chunk_times=[0.3, 0.4], tokens=2),
               LoadResult(arrival=0, sent=0.2, error="429")]
    s = summarize_load(results)
    assert s["served"] == 2 and s["error_kinds"] == {"429": 1} and s["tokens"] == 5
    assert s["throughput"] == pytest.approx(5 / 0.8) and s["ttft_p50"] == pytest.approx(0.35)
    assert s["tpot_p50"] == pytest.approx((0.15 + 0.1) / 2)
    assert summarize_load([LoadResult(arrival=0, error="429")])["served"] == 0


@pytest.mark.parametrize("call, message", [
    (lambda: run_load("127.0.0.1:8000", [LoadRequest("x", 2, 0)]), "http://"),
    (lambda: run_load("http://127.0.0.1:1", []), "no requests"),
    (lambda: run_load("http://127.0.0.1:1", [LoadRequest("x", 2, 0)], endpoint="embeddings"), "endpoint"),
    (lambda: chat_workload(0, 1.0), "count"),
    (lambda: chat_workload(3, -1.0), "arrival rate"),
    (lambda: chat_workload(3, 0.0, fixed_rate=True), "arrival rate"),
    (lambda: agentic_workload(0, 2, 1.0), "conversations"),
    (lambda: agentic_workload(2, 0, 1.0), "turns"),
    (lambda: agentic_workload(2, 2, 1.0, think_seconds=-1), "think_seconds"),
    (lambda: goodput([], 1.0, 0.1), "at least one request"),
    (lambda: goodput([LoadResult(arrival=0)], 0, 0.1), "ttft_slo"),
    (lambda: as_engine_requests(ByteTokenizer(), agentic_workload(1, 2, 1.0)), "served over HTTP only"),
    # issue 50: these were taken (a median or a max of 0) or gave NumPy's error (a negative seed, sigma)
    (lambda: agentic_workload(2, 2, 1.0, median_new_tokens=0), "median_new_tokens"),
    (lambda: agentic_workload(2, 2, 1.0, max_new_tokens=0), "max_new_tokens"),
    (lambda: agentic_workload(2, 2, 1.0, seed=-1), "seed"),
    (lambda: agentic_workload(2, 2, 1.0, seed=2.5), "seed"),
    (lambda: chat_workload(3, 1.0, seed=-1), "seed"),
    (lambda: chat_workload(3, 1.0, sigma=-1.0), "sigma"),
    (lambda: run_load("http://127.0.0.1:1", ["Why?"]), "LoadRequests"),
    (lambda: run_load("http://127.0.0.1:1", [LoadRequest("x", 2, 0)], model="m", extra={"x": object()}), "extra"),
    (lambda: goodput([{"sent": 0.0}], 1.0, 0.1), "not a LoadResult"),
    (lambda: goodput([LoadResult(arrival=0, sent=math.nan, chunk_times=[0.5], tokens=1)], 1.0, 0.1), "finite"),
    (lambda: goodput([LoadResult(arrival=0, sent=0.0, chunk_times=[0.5, math.inf], tokens=2)], 1.0, 0.1), "finite"),
    (lambda: goodput([LoadResult(arrival=0, sent=0.0, chunk_times=[0.5, 0.2], tokens=2)], 1.0, 0.1), "in order"),
    (lambda: goodput([LoadResult(arrival=0, sent=1.0, chunk_times=[0.5], tokens=1)], 1.0, 0.1), "in order"),
])
def test_bad_arguments_are_one_sentence(call, message):
    with pytest.raises(LabError, match=message):
        call()


def test_the_cli_serves_and_the_cli_load_tests_it(tmp_path):
    """`python -m labsupport serve` in a subprocess (a tiny model, a free port), then `loadgen`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = subprocess.Popen([sys.executable, "-m", "labsupport", "serve", "--model", "tiny-llama", "--device", "cpu",
                               "--port", str(port), "--max-slots", "2", "--log-level", "warning"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not start in 120 s"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        out = tmp_path / "load.json"
        done = subprocess.run([sys.executable, "-m", "labsupport", "loadgen", "--url", url, "--rate", "20",
                               "--requests", "3", "--max-tokens", "8", "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert report["served"] == 3 and report["url"] == url and report["arrivals"] == "poisson"
        assert "3/3 served" in done.stdout
        bad = subprocess.run([sys.executable, "-m", "labsupport", "loadgen", "--url", url, "--requests", "0"],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
        unwritable = subprocess.run([sys.executable, "-m", "labsupport", "loadgen", "--url", url, "--out",
                                     str(out / "inside-a-file.json")], capture_output=True, text=True, timeout=120)
        assert unwritable.returncode == 2 and "Cannot write" in unwritable.stderr and "served" not in unwritable.stdout
        nobody = subprocess.run([sys.executable, "-m", "labsupport", "loadgen", "--url", url, "--model", "nope",
                                 "--requests", "2", "--out", str(tmp_path / "none.json")],
                                capture_output=True, text=True, timeout=120)
        assert nobody.returncode == 1 and "0/2 served" in nobody.stdout and "no request was served" in nobody.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_malformed_stream_fails_that_request_alone():
    """A server whose streams break in each way a stream can: every broken request is counted as
    "malformed stream", the good one is measured, and the load test returns."""
    from fastapi import FastAPI, Request as HttpRequest
    from fastapi.responses import StreamingResponse

    token = json.dumps({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
    streams = {1: ["not json"], 2: ["5"], 3: ['{"choices": 3}'], 4: ['{"choices": [{"delta": "a"}]}'],
               5: ['{"usage": [1]}'], 6: [token, token, "[DONE]"]}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        lines = streams[(await request.json())["max_tokens"]]
        return StreamingResponse((f": keep-alive\n\ndata: {line}\n\n" for line in lines), media_type="text/event-stream")
    with BackgroundServer(app) as broken:
        results = run_load(broken.url, [LoadRequest("x", n, 0.0) for n in streams], model="m", timeout=30)
    assert [r.error for r in results] == ["malformed stream"] * 5 + [None]
    figures = summarize_load(results)
    assert figures["served"] == 1 and figures["error_kinds"] == {"malformed stream": 5} and figures["tokens"] == 2


def test_an_agentic_workload_shares_one_system_prompt_and_each_turn_extends_the_last():
    requests = agentic_workload(3, 3, rate=1.0, system_chars=5000, think_seconds=2.0, seed=1)
    assert len(requests) == 9 and [r.arrival for r in requests] == sorted(r.arrival for r in requests)
    assert len({r.system for r in requests}) == 1 and len(requests[0].system) > 5000
    conversations: dict = {}
    for r in requests:                                     # a conversation: the turns with its first question
        first = r.history[0][0] if r.history else r.question
        conversations.setdefault(first, []).append(r)
    assert sorted(len(turns) for turns in conversations.values()) == [3, 3, 3]
    for turns in conversations.values():
        turns.sort(key=lambda r: len(r.history))
        assert [len(t.history) for t in turns] == [0, 1, 2]
        assert [t.arrival - turns[0].arrival for t in turns] == pytest.approx([0.0, 2.0, 4.0])
        for before, after in zip(turns, turns[1:]):       # every prompt extends the one before it
            assert after.messages()[:len(before.messages())] == before.messages()
            assert after.history[-1] == (before.question, AGENT_REPLY)
    assert agentic_workload(3, 3, 1.0, seed=1) == agentic_workload(3, 3, 1.0, seed=1)


def test_goodput_counts_the_requests_within_both_objectives():
    results = [LoadResult(arrival=0, sent=0.0, chunk_times=[0.5, 0.6, 0.7], tokens=3),     # ttft 0.5, tpot 0.1
               LoadResult(arrival=0, sent=0.0, chunk_times=[1.5, 1.6], tokens=2),          # ttft 1.5: late
               LoadResult(arrival=0, sent=0.5, chunk_times=[0.9, 1.9], tokens=2),          # tpot 1.0: slow
               LoadResult(arrival=0, sent=0.6, error="429")]
    g = goodput(results, ttft_slo=1.0, tpot_slo=0.2)
    assert g["met"] == pytest.approx(1 / 4) and g["goodput"] == pytest.approx(1 / 1.9)
    assert goodput(results, ttft_slo=2.0, tpot_slo=2.0)["met"] == pytest.approx(3 / 4)
    as_dicts = [vars(r) for r in results]                   # load_test's "results"
    assert goodput(as_dicts, 1.0, 0.2) == g


def test_agentic_turns_reach_the_server_as_conversations_and_hit_its_prefix_cache(smollm):
    model, tok = smollm
    requests = agentic_workload(2, 2, rate=None, system_chars=600, median_new_tokens=3, max_new_tokens=4,
                                think_seconds=0.5)
    hits = {}
    for caching in (False, True):
        app = create_app(model, tok, "smollm", max_slots=2, max_waiting=8, prefix_caching=caching)
        with BackgroundServer(app) as running:
            figures = load_test(running.url, requests)
        assert figures["errors"] == 0 and figures["served"] == 4
        hits[caching] = app.state.engine.prefix_hit_tokens
        app.state.engine.blocks.assert_no_leaks()
    assert hits[False] == 0 and hits[True] > 600 // 8      # the system prompt's blocks, at least once
    raw = run_load("http://127.0.0.1:1", requests[:1], model="m", endpoint="completions")
    assert raw[0].error == "a conversation needs the chat endpoint"


@pytest.mark.parametrize("url", ["http://", "https://", "http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:abc",
                                 "http://a b:80", "http://127.0.0.1:0"])
def test_a_malformed_url_is_one_sentence_naming_it(url):
    """Issue 50: httpx's InvalidURL or an ExceptionGroup came out as a traceback."""
    for model in (None, "m"):
        with pytest.raises(LabError, match="is not a server's address") as error:
            run_load(url, [LoadRequest("x", 2, 0.0)], model=model, timeout=5)
        assert repr(url) in str(error.value) and "\n" not in str(error.value)


def test_an_unreachable_server_is_one_sentence_naming_its_url():
    with socket.socket() as s:                                                   # a port with no server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LabError, match=f"127.0.0.1:{port}/v1/models .ConnectError.") as error:
        run_load(f"http://127.0.0.1:{port}", [LoadRequest("x", 2, 0.0)], timeout=5)
    assert "\n" not in str(error.value)


def test_an_odd_model_list_is_one_sentence_naming_the_url():
    """Issue 50: a /v1/models reply that is not JSON, has no "data", an empty list or no id: one sentence each."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse, Response

    replies = {"html": PlainTextResponse("<html>hi</html>"), "list": Response("[]", media_type="application/json"),
               "null": Response("null", media_type="application/json"), "nodata": Response('{"models": []}'),
               "empty": Response('{"data": []}'), "strings": Response('{"data": "abc"}'),
               "noid": Response('{"data": [{"name": "m"}]}'), "intid": Response('{"data": [{"id": 5}]}'),
               "missing": Response('{"detail": "Not Found"}', status_code=404)}
    app = FastAPI()

    @app.get("/{case}/v1/models")
    async def models(case: str):
        return replies[case]
    with BackgroundServer(app) as odd:
        for case in replies:
            url = f"{odd.url}/{case}"
            with pytest.raises(LabError, match="Could not read the model's name") as error:
                run_load(url, [LoadRequest("x", 2, 0.0)], timeout=10)
            assert f"{url}/v1/models" in str(error.value) and "\n" not in str(error.value), case


def test_the_clis_seed_is_checked_before_any_load(capsys):
    """`loadgen --seed -1` ended in NumPy's traceback; the check is chat_workload's (the CLI calls it)."""
    from labsupport.cli import main
    assert main(["loadgen", "--url", "http://127.0.0.1:1", "--seed", "-1", "--out", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: seed must be at least 0") and "Traceback" not in err


def test_goodput_skips_a_failed_requests_non_finite_sent_and_ignores_the_order():
    served = [LoadResult(arrival=0, sent=1.0, chunk_times=[1.2, 1.3], tokens=2),
              LoadResult(arrival=0, sent=2.0, chunk_times=[2.5], tokens=1)]
    failed = [LoadResult(arrival=0, sent=s, error="ConnectError") for s in (math.nan, math.inf, -math.inf)]
    expected = goodput(served, 1.0, 0.2)
    assert expected["goodput"] == pytest.approx(2 / 1.5)
    for order in (served + failed, failed + served, failed[::-1] + served[::-1]):
        g = goodput(order, 1.0, 0.2)
        assert g["goodput"] == expected["goodput"] and g["met"] == pytest.approx(2 / 5)
