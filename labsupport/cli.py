"""Command line: ``python -m labsupport tour`` (the main job), ``bench``, and the course's delivery.

    tour | bench                  measure the techniques on this machine (`bench`, `report`)
    student --out student/        student versions of every notebook (`delivery`)
    badges [--repo OWNER/NAME]    rewrite the Colab badges and setup cells (`delivery`)
    check                         exit 1 if a badge or setup cell is stale (`delivery`)

A mistake on the learner's side (a `LabError`) prints one sentence and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
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
                        help="timed repeats per candidate, in every section (default: 5 for baseline, "
                             "batching, precision and speculative; 1 to 3 for the others)")
    parser.add_argument("--kv-lengths", type=int, nargs="*", default=None,
                        help="new-token counts for the KV-cache comparison (default: 64 256 1024)")


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


def main(argv=None) -> int:
    """``python -m labsupport ...``: parse the command line, run it, return the exit status.

    Covers notebooks 00-07: `tour` and `bench` measure their sections, `student`, `badges`
    and `check` deliver them."""
    parser = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="run the course's techniques on this machine and print a report")
    _common(tour)
    tour.add_argument("--out", default="reports", help="directory for report.md and report.json")
    bench = sub.add_parser("bench", help="run the benchmarks and write their figures as JSON")
    _common(bench)
    bench.add_argument("--out", default="bench.json", help="JSON file to write (default bench.json)")
    _delivery_commands(sub)
    args = parser.parse_args(argv)

    try:
        if args.command in ("badges", "check", "student"):
            return _deliver(args)
        require_supported_platform()
        if args.command == "bench":               # before measuring anything: a wrong --out costs no run
            require_writable(args.out)
        else:
            require_writable_report(args.out)
        device = pick_device(args.device)
        options = BenchOptions.from_cli(device, new_tokens=args.new_tokens, repeats=args.repeats,
                                        kv_lengths=args.kv_lengths)
        report = run(args.sections, device=device, model_name=args.model, options=options,
                     progress=lambda m: print(m, flush=True))
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
