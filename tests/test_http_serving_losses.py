"""Notebook 09's "where it loses here" ledger (labsupport.claims.http_serving)."""

from labsupport.claims.http_serving import http_losses


def _row(server, rate, ttft, itl, throughput, errors=0):
    return {"server": server, "rate": rate, "ttft_p50": ttft, "itl_p50": itl, "throughput": throughput,
            "errors": errors, "skipped": None}


def test_http_losses_name_each_cost_from_the_rows():
    rows = [_row("in-process engine", 1.0, 0.100, 0.020, 30.0), _row("our HTTP server", 1.0, 0.130, 0.022, 29.0),
            _row("in-process engine", 4.0, 0.5, 0.03, 60.0), _row("our HTTP server", 4.0, 0.7, 0.04, 48.0, errors=2),
            _row("vLLM server", 4.0, 0.1, 0.01, 100.0)]
    text = " ".join(http_losses(rows, [1.0, 4.0], loads=[25, 120], busy="the load average was 2.0 per core"))
    assert "30 ms later at 1.00 requests/s, at the median: 30% more than in process" in text and "2.0 ms later (10% of an in-process gap)" in text
    assert "delivered 80% of the in-process throughput" in text and "120% of the in-process saturation" in text
    assert "2 request(s) failed" in text and "timed while the load average was 2.0 per core" in text


def test_http_losses_say_so_when_nothing_was_lost_and_skip_missing_rows():
    rows = [_row("in-process engine", 1.0, 0.1, 0.02, 30.0), _row("our HTTP server", 1.0, 0.09, 0.02, 30.0)]
    assert http_losses(rows, [1.0])[0].startswith("HTTP cost nothing measurable here")
    skipped = dict(_row("our HTTP server", 1.0, float("nan"), float("nan"), float("nan")), skipped="not installed")
    assert http_losses([rows[0], skipped], [1.0]) == [
        "Not measured: the load curve has no rows of both our HTTP server and the in-process engine."]
