"""Every bad input the issue's probes sent gets a 400 in one sentence, with the right code, and is
logged (notebook 09, issue 49, item 3); the server serves on after each. Also: /tokenizer_info
carries the special tokens' text (lm-eval's remote tokenizer reads them), a prompt counts once in
the prompt-token metric however many choices it has, and a request cut short is logged."""

import json
import re
import socket
import time

import httpx
import pytest
import torch

from labsupport.serve import BackgroundServer, create_app
from labsupport.weights.fixtures import ByteTokenizer, random_model

NAME = "tiny-llama"
TIMEOUT = 30


@pytest.fixture(scope="module")
def served():
    app = create_app(random_model(NAME, dtype=torch.float64), ByteTokenizer(), NAME, max_slots=2, max_waiting=4,
                     block_size=4)
    with BackgroundServer(app) as server:
        server.app = app
        yield server


COMPLETION = '{"model": "tiny-llama", "max_tokens": 2, %s}'
CHAT = '{"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}'
# (route, raw JSON body, words of the sentence, param, code)
PROBES = [
    ("/v1/completions", COMPLETION % '"prompt": "a\\ud800b"', "lone surrogate .U\\+D800. at character 1", None, None),
    ("/v1/chat/completions", CHAT % '"hi \\udfff"', "'messages.0.content' holds a lone surrogate", None, None),
    ("/tokenize", '{"prompt": "\\ud800"}', "lone surrogate", None, None),
    ("/v1/completions", COMPLETION % '"prompt": "a", "stop": ["\\ud800"]', "'stop.0' holds a lone surrogate", None, None),
    ("/v1/completions", COMPLETION % '"prompt": [-1, 5]', "token ids are whole numbers from 0; item 0 is -1",
     "prompt", None),
    ("/v1/completions", COMPLETION % '"prompt": [[1, 2], [-3]]', "item 0 of prompt 1 is -3", "prompt", None),
    ("/v1/completions", COMPLETION % '"prompt": [1099511627776]', "Token id 1099511627776 .item 0 of the prompt. "
     "is outside the vocabulary", "prompt", "invalid_token_id"),
    ("/v1/completions", COMPLETION % '"prompt": [5, 300]', "Token id 300 .item 1", "prompt", "invalid_token_id"),
    ("/v1/completions", COMPLETION % '"prompt": [1, null]', "item 1 is null", "prompt", None),
    ("/v1/completions", COMPLETION % '"prompt": [1, "a"]', "item 1 is text", "prompt", None),
    ("/v1/completions", COMPLETION % '"prompt": {"a": 1}', "got an object", "prompt", None),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "a", "max_tokens": true}', "'max_tokens'.*integer",
     "max_tokens", None),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "a", "seed": false}', "'seed'.*integer", "seed", None),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "a", "top_k": true}', "'top_k'.*integer", "top_k", None),
    ("/tokenize", '{"messages": []}', "'messages'.*at least 1 item", "messages", None),
    ("/detokenize", '{"tokens": [-1]}', "'tokens'.*greater than or equal to 0", "tokens", None),
    ("/detokenize", '{"tokens": [1099511627776]}', "vocabulary", "tokens", None),
]


@pytest.mark.parametrize("route, body, words, param, code", PROBES,
                         ids=[f"{route}-{i}" for i, (route, *_) in enumerate(PROBES)])
def test_each_bad_input_is_a_400_in_one_sentence_and_logged(served, log_lines, route, body, words, param, code):
    reply = httpx.post(served.url + route, content=body.encode(), headers={"Content-Type": "application/json"},
                       timeout=TIMEOUT)
    error = reply.json()["error"]
    assert reply.status_code == 400, error
    assert re.search(words, error["message"]), error["message"]
    assert error["message"].endswith(".") and "\n" not in error["message"] and "Traceback" not in error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert any("-> 400" in line and error["message"] in line for line in log_lines)
    assert httpx.get(served.url + "/health", timeout=TIMEOUT).status_code == 200


def test_tokenizer_info_carries_the_special_tokens_text_and_ids(served):
    info = httpx.get(served.url + "/tokenizer_info", timeout=TIMEOUT).json()
    for name, text, token_id in (("eos", "</s>", 257), ("bos", "<s>", 256), ("pad", "</s>", 257)):
        assert info[f"{name}_token"] == text and info[f"{name}_token_id"] == token_id
    assert info["unk_token"] is None and info["vocab_size"] == 260


def _prompt_tokens(served) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(served.url + "/metrics", timeout=TIMEOUT).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "labsupport:prompt_tokens_total")


def test_a_prompt_counts_once_in_the_prompt_token_metric_however_many_choices(served):
    before = _prompt_tokens(served)
    reply = httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": ["abcd", "ef"], "n": 2,
                                                              "max_tokens": 2, "temperature": 1, "seed": 1},
                       timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == 6
    assert _prompt_tokens(served) - before == 6


def test_a_request_cut_short_by_its_client_is_logged(served, log_lines):
    body = json.dumps({"model": NAME, "prompt": "gone", "max_tokens": 250, "ignore_eos": True}).encode()
    with socket.create_connection((served.host, served.port), timeout=TIMEOUT) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + TIMEOUT
    while not any("ended before its last token" in line for line in log_lines) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any("the client went away" in line and "aborted 1 choice" in line for line in log_lines)
