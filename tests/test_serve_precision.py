"""What the server serves (notebook 09): --dtype, --quantize int8|int4, /v1/models saying
precision and kernel, the warning when binding beyond 127.0.0.1 without a key (the key itself:
tests/test_serve_guards.py), /metrics for Prometheus, and bad values refused in one sentence."""

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from labsupport import cli  # noqa: E402
from labsupport.errors import LabError  # noqa: E402
from labsupport.serve import BackgroundServer, create_app, server as server_module  # noqa: E402
from labsupport.serve.precision import served_dtype, describe, quantize_for_serving  # noqa: E402
from labsupport.weights.fixtures import ByteTokenizer, random_model  # noqa: E402

NAME = "tiny-llama"
TIMEOUT = 30


def test_dtype_and_quantize_choices_are_checked_in_one_sentence(monkeypatch):
    assert served_dtype("cpu", "bfloat16", "int4") == torch.bfloat16
    for dtype, method, words in (("float64", None, "--dtype must be one of"), ("fp8", None, "--dtype"),
                                 ("float32", "int3", "--quantize must be one of")):
        with pytest.raises(LabError, match=words) as caught:
            served_dtype("cpu", dtype, method)
        assert "\n" not in str(caught.value) and str(caught.value).endswith(".")
    # a T4 (compute capability 7.5) has no bfloat16: refused before loading anything
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(LabError, match="no bfloat16 support"):
        served_dtype(torch.device("cuda"), "bfloat16", None)


def test_the_cli_refuses_a_bad_dtype_before_loading(capsys, monkeypatch):
    monkeypatch.setattr("labsupport.weights.loading.load_model",
                        lambda *a, **k: pytest.fail("the model was loaded before the check"))
    assert cli.main(["serve", "--model", NAME, "--dtype", "float64"]) != 0
    printed = capsys.readouterr()
    assert "--dtype must be one of" in printed.err + printed.out and "Traceback" not in printed.err


@pytest.mark.parametrize("method, weights", [(None, "float32"), ("int8", "int8"), ("int4", "int4")])
def test_models_says_the_precision_and_the_quantized_server_answers(method, weights):
    model = quantize_for_serving(random_model(NAME), method)
    assert describe(model)["weights"] == weights
    with BackgroundServer(create_app(model, ByteTokenizer(), NAME, max_slots=2, block_size=4)) as server:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
        listed = httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()["data"][0]
        assert listed["precision"]["weights"] == weights and listed["precision"]["dtype"] == "float32"
        assert listed["precision"]["kernel"] == describe(model)["kernel"]
        if method == "int4":
            print(listed["precision"]["kernel"])
        out = api.completions.create(model=NAME, prompt="quantized", max_tokens=4, temperature=0, logprobs=1)
        assert len(out.choices[0].logprobs.token_logprobs) == 4


class _NoServer:
    """uvicorn.Server that returns at once: run_server's warning, and its engine loop ending with it."""
    def __init__(self, config):
        self.should_exit = False

    def run(self):
        return None


def test_binding_beyond_localhost_without_a_key_warns(monkeypatch, capsys):
    monkeypatch.setattr(server_module.uvicorn, "Server", _NoServer)
    open_app = create_app(random_model(NAME), ByteTokenizer(), NAME, max_slots=1, block_size=4)
    keyed = create_app(random_model(NAME), ByteTokenizer(), NAME, max_slots=1, block_size=4, api_key="k")
    server_module.run_server(open_app, "0.0.0.0", 8000)
    assert "without an API key" in capsys.readouterr().out
    server_module.run_server(keyed, "0.0.0.0", 8000)
    server_module.run_server(open_app, "127.0.0.1", 8000)
    assert capsys.readouterr().out == ""


def test_metrics_count_requests_tokens_blocks_and_latencies_for_prometheus():
    from prometheus_client.parser import text_string_to_metric_families
    app = create_app(random_model(NAME), ByteTokenizer(), NAME, max_slots=2, block_size=4, api_key="k")
    with BackgroundServer(app) as server:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT)
        api.completions.create(model=NAME, prompt=["abc", "de"], max_tokens=3, temperature=0,
                               extra_body={"ignore_eos": True})
        list(api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         stream=True, extra_body={"ignore_eos": True}))
        assert httpx.get(server.url + "/metrics", timeout=TIMEOUT).status_code == 401      # behind the key
        reply = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer k"}, timeout=TIMEOUT)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(reply.text) for s in family.samples}
        assert samples[("labsupport:requests_total", (("endpoint", "completions"),))] == 1
        assert samples[("labsupport:requests_total", (("endpoint", "chat"),))] == 1
        assert samples[("labsupport:generation_tokens_total", ())] == 3 + 3 + 4
        assert samples[("labsupport:prompt_tokens_total", ())] >= 5
        assert samples[("labsupport:time_to_first_token_seconds_count", ())] == 3
        assert samples[("labsupport:inter_token_latency_seconds_count", ())] == 2 + 2 + 3
        assert samples[("labsupport:kv_cache_blocks_total", ())] == app.state.engine.num_blocks
        assert samples[("labsupport:num_requests_running", ())] == 0
        assert samples[("labsupport:kv_cache_blocks_used", ())] == 0
        assert samples[("labsupport:prefix_cache_hit_tokens", ())] == app.state.engine.prefix_hit_tokens == 0
