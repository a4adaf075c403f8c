"""Command line: ``python -m labsupport tour`` (the main job) and ``python -m labsupport bench``.

A mistake on the learner's side (a `LabError`) prints one sentence and exits with
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from .errors import LabError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: the best available)")
    parser.add_argument("--model", default="smollm2-135m", help="model name (default: the embedded smollm2-135m)")
    parser.add_argument("--sections", nargs="*", default=None, help="which sections to run (default: all)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per generate() call (default 128)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per candidate (default 5)")
    parser.add_argument("--kv-lengths", type=int, nargs="*", default=None,
                        help="new-token counts for the KV-cache comparison (default: 64 256 1024)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="run the course's techniques on this machine and print a report")
    _common(tour)
    tour.add_argument("--out", default="reports", help="directory for report.md and report.json")
    bench = sub.add_parser("bench", help="run the benchmarks and write their figures as JSON")
    _common(bench)
    bench.add_argument("--out", default="bench.json", help="JSON file to write (default bench.json)")
    args = parser.parse_args(argv)

    from . import bench as bench_module
    from .hardware import check_platform
    try:
        check_platform()
        sections = args.sections
        if sections:
            unknown = set(sections) - set(bench_module.SECTIONS)
            if unknown:
                raise LabError(f"Unknown section(s) {sorted(unknown)}; choose from {sorted(bench_module.SECTIONS)}.")
        if args.new_tokens is not None and args.new_tokens < 1:
            raise LabError(f"--new-tokens must be at least 1, got {args.new_tokens}.")
        if args.repeats is not None and args.repeats < 1:
            raise LabError(f"--repeats must be at least 1, got {args.repeats}.")
        report = bench_module.run(sections, device=args.device, model_name=args.model,
                                  new_tokens=args.new_tokens, repeats=args.repeats,
                                  kv_lengths=args.kv_lengths, progress=lambda m: print(m, flush=True))
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from .report import text_table, write_report
    print()
    print(text_table(report))
    if args.command == "bench":
        print(f"\nSaved {bench_module.write_json(report, args.out)}")
    else:
        path = write_report(report, args.out)
        print(f"\nSaved {path.with_name('report.md')} and {path.with_name('report.json')}")
        print(f"The report, with plots (open it in a browser): {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
