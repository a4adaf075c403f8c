"""The bench section http_serving (notebook 09) and its figure, on a tiny model: every server's
row at every rate, peers that cannot run say why in one sentence, nothing leaks."""

import sys

import pytest
import torch

from labsupport.bench import http_serving_agentic, http_serving
from labsupport.bench.peers import http_servers
from labsupport.bench.core import BenchContext
from labsupport.bench.peers.http_servers import peer_server
from labsupport.bench.http_serving import HttpServingOptions, http_load_curve
from labsupport.bench.suite import SECTIONS
from labsupport.errors import LabError
from labsupport.plots.http_serving import http_load_curve_figure
from labsupport.weights.fixtures import ByteTokenizer, random_model

# one turn per conversation: the byte tokenizer has no chat template, so the server takes a system
# message and one user message only
TINY = HttpServingOptions(requests=3, slots=2, median_new_tokens=4, max_new_tokens=8, loads=(50, 150),
                          conversations=3, turns=1, system_chars=100, saturated_requests=5, saturated_median_tokens=3)


def test_the_load_curve_has_a_row_per_server_and_rate_and_the_figure_draws_the_measured_ones():
    model = random_model("tiny-llama")
    rows = http_load_curve(model, ByteTokenizer(), "tiny", [5.0, 50.0], TINY,
                           peers={"vLLM server": "vLLM skipped: it needs a CUDA GPU."})
    assert [(r["server"], r["rate"]) for r in rows] == [
        (s, rate) for rate in (5.0, 50.0) for s in ("in-process engine", "our HTTP server", "vLLM server")]
    for r in rows:
        if r["server"] == "vLLM server":
            assert r["skipped"] and r["tokens"] == 0
        else:
            assert r["skipped"] is None and r["errors"] == 0 and r["throughput"] > 0 and r["ttft_p50"] > 0
    inproc = [r["tokens"] for r in rows if r["server"] == "in-process engine"]
    assert inproc == [r["tokens"] for r in rows if r["server"] == "our HTTP server"]      # the same work
    fig = http_load_curve_figure(rows)
    assert {t.name for t in fig.data} == {"in-process engine", "our HTTP server"} and len(fig.data) == 6
    assert list(fig.data[0].x) == [5.0, 50.0]


def test_the_section_runs_when_named_and_says_why_each_peer_is_missing():
    assert not SECTIONS["http_serving"].in_default_run and SECTIONS["http_serving"].notebook.startswith("09")
    ctx = BenchContext(device=torch.device("cpu"), model_name="tiny-llama")
    section = http_serving.section_http_serving(ctx, TINY)
    assert "GGUF file only" in section["peers"]["llama.cpp server"]
    assert "GGUF file only" in section["peers"]["llama-server"]
    assert "CUDA GPU" in section["peers"]["vLLM server"]
    names = [f["name"] for f in section["figures"]]
    assert len(names) == 3 + 5 + 3 + 3 + 3 + 3 + 2 and all(n.startswith("http serving") for n in names)
    # saturated: our server as `python -m labsupport serve` runs it, a process of its own; llama-server says why not
    ours, theirs = section["saturated"]
    assert ours["server"] == "our server process" and ours["rate"] is None and ours["skipped"] is None
    assert ours["errors"] == 0 and ours["throughput"] > 0 and ours["precision"].startswith("int4")
    assert theirs["server"] == "llama-server" and "GGUF file only" in theirs["skipped"]
    saturated = [f for f in section["figures"] if "saturated" in f["name"]]
    assert len(saturated) == 3 and all(f["value"] != f["value"] and "GGUF file only" in f["note"] for f in saturated)
    off, on = section["agentic"]
    assert off["errors"] == on["errors"] == 0 and off["served"] == on["served"] == 3
    # 2 slots, 3 conversations: the third at least starts after a first one cached the system prompt
    assert off["prefix_hit_tokens"] == 0 and on["prefix_hit_tokens"] >= 96
    assert 0 <= on["met"] <= 1 and on["goodput"] >= 0
    int4 = [f for f in section["figures"] if "our int4 HTTP server / llama-server" in f["name"]]
    assert len(int4) == 5 and all(f["value"] != f["value"] and "GGUF file only" in f["note"] for f in int4)
    served = {r["server"]: r["precision"] for r in section["rows"] if not r["skipped"]}
    assert served["our HTTP server"] == "float32 weights" and served["our HTTP server (int4)"].startswith("int4")
    by_name = {f["name"]: f for f in section["figures"]}
    ratio = by_name["http serving: throughput at the highest rate, HTTP server / in-process"]
    assert ratio["value"] > 0 and ratio["target"] == 0.9 and ratio["paths"] == ["eager"]     # a CPU: eager, said
    peer = by_name["http serving: our HTTP server / vLLM server throughput at the highest rate"]
    assert peer["value"] != peer["value"] and "CUDA" in peer["note"]                   # nan, and why
    assert len(section["rows"]) == 6 * len(TINY.loads) and section["rates"] == sorted(section["rates"])
    quality = {q["weights"]: q for q in section["quality"]}
    assert set(quality) == {"float32", "int8", "int4"}
    assert all(q["largest_log_prob_difference"] < 1e-4 for q in quality.values())
    assert quality["int4"]["in_process_perplexity"] != quality["float32"]["in_process_perplexity"]
    assert {f["name"] for f in section["figures"]} >= {"http serving quality: served perplexity, int4 / float32"}
    int4_rows = [r for r in section["rows"] if r["server"] == "our HTTP server (int4)"]
    assert all(r["errors"] == 0 and r["throughput"] > 0 for r in int4_rows)
    # the int4 rows are served by the same process as the saturated run, not a thread of this one
    assert all(r["decode_path"] is None and r["precision"] == ours["precision"] for r in int4_rows)


def test_llama_server_is_found_or_refused_in_one_sentence(tmp_path, monkeypatch):
    from labsupport.weights.loading import EMBEDDED
    monkeypatch.setenv(http_servers.LLAMA_SERVER_ENV, str(tmp_path / "missing"))
    binary, reason = http_servers.llama_server_binary()
    assert binary is None and "not an executable file" in reason
    monkeypatch.delenv(http_servers.LLAMA_SERVER_ENV)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "not built here" in http_servers.llama_server_binary()[1]
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert http_servers.llama_server_binary() == (str(fake), None)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("LABSUPPORT_GGUF", str(gguf))
    command, reason = http_servers.llama_server_command(EMBEDDED, "cpu", 8123, slots=4, context=512)
    assert reason is None and command[0] == str(fake)
    flags = {flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")}
    assert flags["--parallel"] == "4" and flags["--ctx-size"] == str(4 * 512) and flags["--model"] == str(gguf)
    assert flags["--threads"] == flags["--threads-batch"] == str(torch.get_num_threads())
    assert "--cont-batching" in command and "--no-webui" in command and "--no-repack" in command
    assert "CPU run only" in http_servers.llama_server_command(EMBEDDED, "cuda", 8123, 4, 512)[1]
    assert "GGUF file only" in http_servers.llama_server_command("tiny-llama", "cpu", 8123, 4, 512)[1]


def test_a_peer_server_that_cannot_start_is_one_sentence():
    with pytest.raises(LabError, match="exited .*boom"):
        with peer_server([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], 1, timeout=30):
            pass


def test_in_a_thread_returns_the_value_and_raises_the_error():
    from labsupport.bench.http_serving import in_a_thread
    import threading
    assert in_a_thread(lambda a, b: (a + b, threading.current_thread().name), 2, 3) == (5, "labsupport-in-process")
    with pytest.raises(LabError, match="boom"):
        in_a_thread(lambda: (_ for _ in ()).throw(LabError("boom")))


def test_the_options_refuse_bad_sizes_in_one_sentence():
    with pytest.raises(LabError, match="http_serving.requests"):
        HttpServingOptions(requests=0)
    with pytest.raises(LabError, match="median_new_tokens .* at most max_new_tokens"):
        HttpServingOptions(median_new_tokens=30, max_new_tokens=8)


def test_agentic_serving_sends_whole_conversations_and_the_cache_serves_their_prefixes(smollm):
    model, tok = smollm                                     # a chat template: turns as the server builds them
    sizes = HttpServingOptions(slots=2, median_new_tokens=3, max_new_tokens=4, conversations=2, turns=2,
                               system_chars=600)
    off, on = http_serving_agentic.agentic_serving(model, tok, "smollm2-135m", sizes, rate=1.0)
    for row in (off, on):
        assert row["errors"] == 0 and row["served"] == 4, row["error_kinds"]
        assert row["prompt_tokens_longest"] > 600 // 8 and row["decode_path"] == "eager"
    assert off["prefix_hit_tokens"] == 0 and on["prefix_hit_tokens"] >= 600 // 8
    figures = http_serving_agentic.agentic_figures([off, on], sizes)
    assert len(figures) == 3 and figures[0]["value"] > 0 and figures[1]["value"] > 0     # TTFT off / on
    goodput = figures[2]
    assert goodput["unit"] == "requests/s" and goodput["value"] == on["goodput"]      # defined when off's is 0
    assert f"{off['goodput']:.2f} without" in goodput["note"]


def test_the_saturated_figures_are_ours_over_llama_servers_and_nan_with_the_reason():
    from labsupport.bench.http_serving_agentic import serving_row
    from labsupport.bench.http_serving_saturated import OUR_PROCESS, our_server_command, saturated_figures
    figures = {"throughput": 90.0, "ttft_p50": 2.0, "itl_p50": 0.030, "errors": 0}
    rows = [serving_row(OUR_PROCESS, None, figures, precision="int4 weights, W4A8 kernel"),
            serving_row("llama-server", None, {**figures, "throughput": 150.0, "itl_p50": 0.020}, precision="Q4_1")]
    by = {f["name"].rsplit(", ", 1)[1]: f for f in saturated_figures(rows, TINY)}
    assert by["throughput"]["value"] == 0.6
    assert by["ttft p50"]["value"] == 1.0 and by["itl p50"]["value"] == 1.5
    assert "30.0 against 20.0 ms; 5 requests at once, 2 slots" in by["itl p50"]["note"]
    rows[1] = serving_row("llama-server", None, skipped="llama-server is not built here.")
    assert all(f["value"] != f["value"] and f["note"] == "llama-server is not built here."
               for f in saturated_figures(rows, TINY))
    command = our_server_command("smollm2-135m", "cpu", 8123, 4, 32, int4=True, cache_tokens=2048)
    assert command[1:4] == ["-m", "labsupport", "serve"] and command[-2:] == ["--quantize", "int4"]
    assert command[command.index("--max-slots") + 1] == "4" and command[command.index("--max-waiting") + 1] == "32"
    assert command[command.index("--cache-tokens") + 1] == "2048"
    assert "--cache-tokens" not in our_server_command("smollm2-135m", "cpu", 8123, 4, 32, int4=False)


def test_our_server_process_that_cannot_start_is_one_sentence_in_its_rows(monkeypatch):
    """The section's server process (`our_server_peer`) that cannot start gives the sentence; the
    saturated run then has a row saying why, and the load curve a skipped int4 row."""
    from contextlib import ExitStack
    from labsupport.bench import http_serving_saturated as saturated
    monkeypatch.setattr(saturated, "our_server_command", lambda *a, **k: [sys.executable, "-c", "raise SystemExit(3)",
                                                                           "--port", "1"])
    with ExitStack() as running:
        peer = saturated.our_server_peer(running, "tiny-llama", "cpu", 2, 4, int4=True)
    assert isinstance(peer, str) and peer.startswith("our server could not start:")
    rows = saturated.saturated_rows("tiny-llama", TINY, peer, "llama-server is not built here.")
    assert [r["skipped"] for r in rows] == [peer, "llama-server is not built here."]


@pytest.mark.platform                  # it quantizes: int4 on aten's kernel (tests/test_platform_marker.py)
def test_our_server_process_rows_say_the_precision_the_server_reports(monkeypatch):
    """The label comes from the server's /v1/models, never from the flag asked for: an int4 server
    whose layers run aten's kernel (a CPU where the W4A8 kernel does not build) says so in its rows."""
    from contextlib import ExitStack
    from labsupport.bench import http_serving_saturated as saturated
    from labsupport.engine.quant import quantize_model
    from labsupport.serve import BackgroundServer, create_app
    from labsupport.serve.precision import describe, precision_words
    model = random_model("tiny-llama")
    quantize_model(model, "int4", group_size=32, kernel="fast")               # aten's int4 kernel, not W4A8
    with BackgroundServer(create_app(model, ByteTokenizer(), "tiny-llama", max_slots=2, block_size=4)) as server:
        monkeypatch.setattr(saturated, "start_peer", lambda *a, **k: (server.url, None))
        with ExitStack() as running:
            url, extra, words = saturated.our_server_peer(running, "tiny-llama", "cpu", 2, 4, int4=True)
    assert url == server.url and extra == {}
    assert words == precision_words(describe(model)) and "W4A8" not in words and words.startswith("int4 weights")


def test_start_peer_gives_the_url_or_the_sentence_and_stops_the_server_with_its_stack():
    from contextlib import ExitStack
    from labsupport.bench.peers.http_servers import start_peer
    with ExitStack() as running:
        url, failed = start_peer(running, [sys.executable, "-c", "print('boom'); raise SystemExit(3)", "--port", "1"],
                                 "a peer", timeout=30)
    assert url is None and failed.startswith("a peer could not start: The server exited") and "boom" in failed
