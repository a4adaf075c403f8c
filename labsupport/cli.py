"""Command line: ``python -m labsupport tour`` (the main job), ``bench``, and the course's delivery.

    tour | bench                  measure the techniques on this machine (`bench`, `report`)
    serve [--host --port ...]     an OpenAI-compatible server over the serving engine (`serve`)
    loadgen --url URL --rate R    load-test any OpenAI-compatible server (`lab.http_serving_loadgen`)
    student --out student/        student versions of every notebook (`delivery`)
    badges [--repo OWNER/NAME]    rewrite the Colab badges and setup cells (`delivery`)
    check                         exit 1 if a badge or setup cell is stale (`delivery`)

A mistake on the learner's side (a `LabError`) prints one sentence and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import delivery
from .bench import BenchOptions, run, write_json
from .bench.core import require_writable
from .errors import LabError
from .engine.hardware import require_supported_platform, pick_device
from .report import require_writable_report, text_table, write_report


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the best available)")
    parser.add_argument("--model", default="smollm2-135m", help="model name (default: the embedded smollm2-135m)")
    parser.add_argument("--sections", nargs="*", default=None, help="which sections to run (default: all but compile, which runs only when named)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="new tokens per generate() call, in every section that has such a count "
                             "(default: 128 for baseline, engines and speculative, 32 for batching, precision and "
                             "quantization, 64 for compile)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repeats per candidate, in every section (default: 5 for batching, "
                             "precision and engines; 1 to 3 for the others)")
    parser.add_argument("--kv-lengths", type=int, nargs="*", default=None,
                        help="new-token counts for the KV-cache comparison (default: 64 256 1024)")
    parser.add_argument("--all-peers", action="store_true",
                        help="the engines section's slow rows too: compiled decoding (ours and Hugging Face's "
                             "static cache + torch.compile), Hugging Face's prompt lookup and assisted generation "
                             "(minutes more on a 2-core CPU)")


def _delivery_commands(sub) -> None:
    """badges, check and student: `delivery`'s commands, each with --root (the repository)."""
    commands = {"badges": "rewrite Colab badges, setup cells and the README's badges",
                "check": "exit 1 if a notebook or the README is stale",
                "student": "write student versions of every notebook"}
    parsers = {name: sub.add_parser(name, help=text) for name, text in commands.items()}
    for parser in parsers.values():
        parser.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    parsers["badges"].add_argument("--repo", help=f"OWNER/NAME on GitHub (default: REPO = {delivery.REPO!r}); "
                                                  "also stored in REPO")
    parsers["badges"].add_argument("--branch", help=f"branch the badges open (default: {delivery.BRANCH!r})")
    parsers["student"].add_argument("--out", type=Path, default=Path("student"),
                                    help="output folder (default: student/)")


def _deliver(args) -> int:
    """Run one of `delivery`'s commands; its exit status."""
    if args.command == "badges":
        return delivery.command_badges(args.root, args.repo, args.branch)
    if args.command == "check":
        return delivery.command_check(args.root)
    return delivery.command_student(args.root, args.out)


def _serving_commands(sub) -> None:
    """serve and loadgen (notebook 09): the HTTP server and the load generator."""
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the serving engine")
    serve.add_argument("--model", default="smollm2-135m", help="model name (default: the embedded smollm2-135m)")
    serve.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    serve.add_argument("--device", default=None, help="cpu, cuda, ... (default: the best available)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 serves every "
                            "network the machine is on: give it an --api-key)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--max-slots", type=int, default=8, help="sequences decoded together (default 8)")
    serve.add_argument("--max-waiting", type=int, default=64,
                       help="requests queued beyond the slots before new ones get a 429 (default 64)")
    serve.add_argument("--policy", default="continuous", choices=["continuous", "static"])
    serve.add_argument("--token-budget", type=int, default=None,
                       help="prompt tokens per engine step: chunked prefill (default 256 on a CPU, 2048 on a GPU; "
                            "0: each prompt whole in its own pass)")
    serve.add_argument("--prefix-caching", action="store_true", help="share cached blocks of common prompt prefixes")
    serve.add_argument("--block-size", type=int, default=16, help="positions per cache block (default 16)")
    serve.add_argument("--cache-tokens", type=int, default=None,
                       help="positions the paged cache holds (default: max_slots x min(context, 1024))")
    serve.add_argument("--dtype", default="float32",
                       help="the model's precision: float32 (default), bfloat16 or float16 (refused where the "
                            "hardware cannot run it)")
    serve.add_argument("--quantize", default=None,
                       help="int8 or int4 weights (notebook 04; int4 runs the W4A8 kernel on a CPU); default none")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route but /health (default: no "
                            "key; set one whenever --host is beyond 127.0.0.1)")
    serve.add_argument("--max-body-bytes", type=int, default=None,
                       help="the largest request body read, in bytes (default 2 MiB; a 413 past it)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    load = sub.add_parser("loadgen", help="send a seeded workload to an OpenAI-compatible server, write JSON")
    load.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    load.add_argument("--rate", type=float, default=None, help="requests per second (default: all at once)")
    load.add_argument("--fixed-rate", action="store_true", help="evenly spaced arrivals (default: Poisson)")
    load.add_argument("--requests", type=int, default=24, help="requests in the workload (default 24)")
    load.add_argument("--model", default=None, help="model name to ask for (default: the server's first)")
    load.add_argument("--endpoint", default="chat", choices=["chat", "completions"])
    load.add_argument("--median-tokens", type=float, default=16, help="median answer length (default 16)")
    load.add_argument("--max-tokens", type=int, default=256, help="longest answer (default 256)")
    load.add_argument("--seed", type=int, default=0, help="seed of the lengths and arrivals (default 0)")
    load.add_argument("--timeout", type=float, default=300, help="seconds one request may take (default 300)")
    load.add_argument("--out", default="loadgen.json", help="JSON file to write (default loadgen.json)")


def _serve(args) -> int:
    from .serve import create_app, run_server
    from .serve.guards import MAX_BODY_BYTES
    from .serve.precision import quantize_for_serving, served_dtype
    from .weights.loading import load_model

    require_supported_platform()
    device = pick_device(args.device)
    dtype = served_dtype(device, args.dtype, args.quantize)      # before minutes of loading
    model, tokenizer = load_model(args.model, device=device, dtype=dtype)
    quantize_for_serving(model, args.quantize)
    app = create_app(model, tokenizer, args.served_model_name or args.model, max_waiting=args.max_waiting,
                     api_key=args.api_key,
                     max_body_bytes=MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes,
                     max_slots=args.max_slots, policy=args.policy,
                     **({} if args.token_budget is None else {"token_budget": args.token_budget or None}),
                     prefix_caching=args.prefix_caching, block_size=args.block_size, cache_tokens=args.cache_tokens)
    run_server(app, args.host, args.port, args.log_level)
    return 0


def _loadgen(args) -> int:
    import json

    from .lab.http_serving_loadgen import chat_workload, load_test

    requests = chat_workload(args.requests, args.rate, median_new_tokens=args.median_tokens,
                             max_new_tokens=args.max_tokens, seed=args.seed, fixed_rate=args.fixed_rate)
    out = require_writable(args.out)                 # before the load, not after minutes of it
    figures = load_test(args.url, requests, model=args.model, endpoint=args.endpoint, timeout=args.timeout)
    report = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "url": args.url, "rate": args.rate,
              "arrivals": "fixed" if args.fixed_rate else "poisson", "endpoint": args.endpoint, **figures}
    out.write_text(json.dumps(report, indent=2))
    print(f"{figures['served']}/{figures['requests']} served, {figures['errors']} errors {figures['error_kinds']}; "
          f"{figures['throughput']:.1f} tokens/s; TTFT p50 {figures['ttft_p50'] * 1e3:.0f} ms, "
          f"p99 {figures['ttft_p99'] * 1e3:.0f} ms; ITL p50 {figures['itl_p50'] * 1e3:.0f} ms, "
          f"p99 {figures['itl_p99'] * 1e3:.0f} ms")
    print(f"Saved {args.out}")
    if figures["served"] == 0:
        print(f"error: no request was served ({figures['error_kinds']}); is the server at {args.url} up, and "
              f"does it serve the {args.endpoint} endpoint?", file=sys.stderr)
        return 1
    return 0


def _previous_report(path: Path) -> dict | None:
    """The report an earlier run wrote at `path` (its sections' seconds estimate this run's), or None."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every subcommand. Notebooks 00-09."""
    parser = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="run the course's techniques on this machine and print a report")
    _common(tour)
    tour.add_argument("--out", default="reports", help="directory for report.md and report.json")
    bench = sub.add_parser("bench", help="run the benchmarks and write their figures as JSON")
    _common(bench)
    bench.add_argument("--out", default="bench.json", help="JSON file to write (default bench.json)")
    _delivery_commands(sub)
    _serving_commands(sub)
    return parser


def main(argv=None) -> int:
    """``python -m labsupport ...``: parse the command line, run it, return the exit status.

    Covers notebooks 00-09: `tour` and `bench` measure their sections, `student`, `badges`
    and `check` deliver them, `serve` and `loadgen` serve over HTTP and measure it."""
    args = build_parser().parse_args(argv)

    try:
        if args.command in ("badges", "check", "student"):
            return _deliver(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "loadgen":
            return _loadgen(args)
        require_supported_platform()
        if args.command == "bench":               # before measuring anything: a wrong --out costs no run
            require_writable(args.out)
        else:
            require_writable_report(args.out)
        device = pick_device(args.device)
        options = BenchOptions.from_cli(device, new_tokens=args.new_tokens, repeats=args.repeats,
                                        kv_lengths=args.kv_lengths, all_peers=args.all_peers)
        previous = _previous_report(Path(args.out) / "report.json" if args.command == "tour" else Path(args.out))
        report = run(args.sections, device=device, model_name=args.model, options=options,
                     progress=lambda m: print(m, flush=True), bars=True, previous=previous)
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    print()
    print(text_table(report))
    if args.command == "bench":
        print(f"\nSaved {write_json(report, args.out)}")
    else:
        path = write_report(report, args.out)
        print(f"\nSaved {path.with_name('report.md')} and {path.with_name('report.json')}")
        print(f"The report, with plots (open it in a browser): {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
