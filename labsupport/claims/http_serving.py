"""Where notebook 09's HTTP server did not pay on this machine: the notebook's "where it loses
here" ledger, one sentence per loss, from the load curve's rows.

Introduced in notebook 09 (serving over HTTP). Rows: `bench.http_serving.http_load_curve`'s
(server, rate, ttft_p50, itl_p50, throughput, errors, skipped), the same requests served by
the in-process engine and by our HTTP server at each rate.
"""

from __future__ import annotations

from typing import Sequence

INPROC, HTTP = "in-process engine", "our HTTP server"
THROUGHPUT_KEPT = 0.9       # the bench's target: HTTP keeps at least 90% of the in-process throughput


def _at(rows: Sequence[dict], server: str, rate: float) -> dict | None:
    return next((r for r in rows if r["server"] == server and r["rate"] == rate and not r.get("skipped")), None)


def http_losses(rows: Sequence[dict], rates: Sequence[float], loads: Sequence[int] | None = None,
                busy: str | None = None) -> list[str]:
    """Where serving over HTTP cost something against the in-process engine in this run, one
    sentence each: the first token's delay and each later token's at the lowest rate, the
    throughput kept at the highest rate (below THROUGHPUT_KEPT, 0.9, a loss), and errors.

    Introduced in notebook 09 (serving over HTTP). rates: the load curve's rates, lowest first;
    loads: the same as percentages of the in-process saturation rate (for the wording); busy:
    `busy.busy_reason` while the curve ran, carried by every timed line."""
    note = f" This was timed while {busy}." if busy else ""
    lines = []
    low, high = rates[0], rates[-1]
    inproc, http = _at(rows, INPROC, low), _at(rows, HTTP, low)
    if inproc and http:
        ttft = http["ttft_p50"] - inproc["ttft_p50"]
        if ttft > 0:
            lines.append(f"Over HTTP the first token came {1e3 * ttft:.0f} ms later at {low:.2f} requests/s, at the "
                         f"median: {ttft / inproc['ttft_p50']:.0%} more than in process. Every request has these costs: "
                         f"parsing the body, tokenizing, the hop to the engine thread and the first event.{note}")
        itl = http["itl_p50"] - inproc["itl_p50"]
        if itl > 0:
            lines.append(f"Each later token came {1e3 * itl:.1f} ms later ({itl / inproc['itl_p50']:.0%} of an "
                         "in-process gap). This server decodes the whole answer again at every token, and it sends "
                         f"one event per token.{note}")
    inproc, http = _at(rows, INPROC, high), _at(rows, HTTP, high)
    if inproc and http:
        kept = http["throughput"] / inproc["throughput"]
        if kept < THROUGHPUT_KEPT:
            at = f"{loads[-1]}% of the in-process saturation, " if loads else ""
            lines.append(f"At {high:.2f} requests/s ({at}the highest rate) the HTTP server delivered {kept:.0%} of the "
                         "in-process throughput. The event loop, the JSON and the detokenizer share the CPU and "
                         f"Python's GIL with the thread that steps the model.{note}")
    errors = sum(r["errors"] for r in rows if r["server"] == HTTP)
    if errors:
        lines.append(f"{errors} request(s) failed over HTTP in the sweep: the in-process engine had no socket to lose.")
    if not any(_at(rows, HTTP, rate) and _at(rows, INPROC, rate) for rate in (low, high)):
        lines.append("Not measured: the load curve has no rows of both our HTTP server and the in-process engine.")
    if not lines:
        lines.append("HTTP cost nothing measurable here. The first token and the later tokens came no later than in "
                     f"process. The HTTP server kept {THROUGHPUT_KEPT:.0%} or more of the throughput.")
    return lines
