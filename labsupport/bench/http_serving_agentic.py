"""Notebook 09's ``http_serving`` section beyond the load curve: an agent's traffic with and
without prefix caching, and the model's quality scored through the server.

Introduced in notebook 09 (serving over HTTP). `agentic_serving` serves `loadgen.agentic_workload`
(one long shared system prompt, conversations that grow turn by turn) twice, goodput under the
sizes' TTFT and TPOT objectives; `served_quality` scores fp32, int8 and int4 weights through
the server by echo + log-probabilities (`lab.http_serving_quality`), each beside the same scores in
process.
"""

from __future__ import annotations

from ..lab.http_serving_loadgen import agentic_workload, goodput, load_test
from .core import reported

KEYS = ("throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50")


def serving_row(server: str, rate: float | None, figures: dict | None = None, skipped: str | None = None,
                precision: str | None = None) -> dict:
    """One server's row of the section: its load figures (`KEYS`, nan where it did not run), errors,
    tokens and decode path, or `skipped` with the reason. rate None: all requests at once. Notebook 09."""
    nan = float("nan")
    figures = figures or {}
    return {"server": server, "rate": rate, "skipped": skipped, "precision": precision,
            "errors": figures.get("errors", 0),
            "tokens": figures.get("tokens", 0), "decode_path": figures.get("decode_path"),
            **{k: figures.get(k, nan) for k in KEYS}}


def _prompt_length(tokenizer, request) -> int:
    """Tokens of a request's prompt as a chat endpoint builds it (the template; without one, the
    system text, a blank line and the question)."""
    if getattr(tokenizer, "chat_template", None) is not None:
        text = tokenizer.apply_chat_template(request.messages(), tokenize=False, add_generation_prompt=True)
    else:
        text = f"{request.system}\n\n{request.question}" if request.system else request.question
    return len(tokenizer.encode(text, add_special_tokens=False))


def agentic_serving(model, tokenizer, model_name: str, sizes, rate: float, seed: int = 0) -> list[dict]:
    """An agent's traffic (`loadgen.agentic_workload`: one long shared system prompt, each turn
    extending the last) served by our server without and with prefix caching, one after the
    other: one row each with the load test's figures, the goodput under the sizes' SLOs and the
    prompt positions found in the prefix cache. Notebook 09 (serving over HTTP)."""
    from ..serve import BackgroundServer, create_app
    requests = agentic_workload(sizes.conversations, sizes.turns, rate, system_chars=sizes.system_chars,
                                median_new_tokens=sizes.median_new_tokens, max_new_tokens=sizes.max_new_tokens,
                                seed=seed)
    longest = max(_prompt_length(tokenizer, r) + r.max_tokens for r in requests)
    rows = []
    for caching in (False, True):
        app = create_app(model, tokenizer, model_name, max_waiting=len(requests), max_slots=sizes.slots,
                         cache_tokens=sizes.slots * longest, prefix_caching=caching)
        with BackgroundServer(app) as server:
            figures = load_test(server.url, requests, model=model_name)
        app.state.engine.blocks.assert_no_leaks()
        rows.append({"server": f"our HTTP server, prefix caching {'on' if caching else 'off'}", "rate": rate,
                     "prompt_tokens_longest": longest, "prefix_hit_tokens": app.state.engine.prefix_hit_tokens,
                     "decode_path": app.state.engine.decode_path,
                     **goodput(figures["results"], sizes.ttft_slo_ms / 1e3, sizes.tpot_slo_ms / 1e3),
                     **{k: figures[k] for k in ("requests", "served", "errors", "error_kinds", "tokens", *KEYS)}})
    return rows


def agentic_figures(rows: list[dict], sizes) -> list[dict]:
    """Prefix caching's gain on the agentic workload: TTFT p50 and p99 (off / on) and the goodput
    with the cache (without it in the note), each with the figures in its note. Notebook 09 (serving over HTTP)."""
    off, on = rows
    where = (f"{sizes.conversations} conversations x {sizes.turns} turns at {on['rate']:.2f} conversations/s, "
             f"system prompt {sizes.system_chars} characters, longest prompt + answer {on['prompt_tokens_longest']} "
             f"tokens; {on['prefix_hit_tokens']} prompt positions from the cache; errors {off['errors']} and "
             f"{on['errors']}")
    figures = [reported(f"http serving agentic: prefix caching's time to first token gain, {q} (off / on)",
                        off[f"ttft_{q}"] / on[f"ttft_{q}"], "x",
                        note=f"{off[f'ttft_{q}'] * 1e3:.0f} ms off, {on[f'ttft_{q}'] * 1e3:.0f} ms on; {where}")
               for q in ("p50", "p99")]
    # goodput as requests/s, not a ratio: without the cache it is often 0, and a ratio over 0 says nothing
    figures.append(reported("http serving agentic: goodput with prefix caching", on["goodput"], "requests/s",
                            note=f"{on['goodput']:.2f} with against {off['goodput']:.2f} without, requests/s within TTFT "
                                 f"<= {sizes.ttft_slo_ms} ms and TPOT <= {sizes.tpot_slo_ms} ms ({on['met']:.0%} "
                                 f"and {off['met']:.0%} of requests)"))
    return figures


QUALITY_WEIGHTS = ("float", "int8", "int4")


def served_quality(variants, tokenizer, model_name: str, eval_tokens: int = 256) -> list[dict]:
    """Perplexity and the multiple-choice accuracy through our server, for fp32, int8 and int4
    weights, each beside the same scores in process (`lab.http_serving_quality.quality_row`): what an
    evaluation harness would measure through the server. Notebook 09 (serving over HTTP)."""
    from ..lab.quality import eval_tokens as first_tokens
    from ..lab.http_serving_quality import quality_row
    from ..serve import BackgroundServer, create_app
    context = variants.get("float32").config.max_position
    ids = first_tokens(tokenizer, max_tokens=min(eval_tokens, context - 1))    # the server reserves one position
    rows = []
    for weights in QUALITY_WEIGHTS:
        model = variants.get("float32", weights)
        with BackgroundServer(create_app(model, tokenizer, model_name)) as server:
            rows.append({"weights": "float32" if weights == "float" else weights,
                         **quality_row(f"our HTTP server ({weights})", server.url, model_name, model, tokenizer, ids)})
    return rows


def quality_figures(quality: list[dict]) -> list[dict]:
    """Served = in process (the largest log-probability difference, target 1e-4) per weights,
    and what int8 and int4 cost in perplexity through the server. Notebook 09."""
    by = {q["weights"]: q for q in quality}
    figures = [reported(f"http serving quality: largest served - in-process log-probability difference ({w})",
                        q["largest_log_prob_difference"], "nats", target=1e-4, higher_is_better=False,
                        note=f"perplexity {q['served_perplexity']:.3f} served, {q['in_process_perplexity']:.3f} in "
                             f"process on {q['tokens']} tokens; multiple choice {q['served_choice_accuracy']:.0%} "
                             f"served, {q['in_process_choice_accuracy']:.0%} in process ({q['questions']} questions)")
               for w, q in by.items()]
    for w in ("int8", "int4"):
        if w in by and "float32" in by:
            figures.append(reported(f"http serving quality: served perplexity, {w} / float32",
                                    by[w]["served_perplexity"] / by["float32"]["served_perplexity"], "x",
                                    higher_is_better=False,
                                    note=f"{by[w]['served_perplexity']:.3f} against {by['float32']['served_perplexity']:.3f}"
                                         f"; multiple choice {by[w]['served_choice_accuracy']:.0%} against "
                                         f"{by['float32']['served_choice_accuracy']:.0%}"))
    return figures
