"""Run the same bench sections on an older revision and on this tree, side by side in one run,
and tabulate every figure both report: has a refactoring changed what the course measures?

    python scripts/bench_against.py 4fe9884 --sections serving baseline --out reports/against.json

The rounds alternate A B B A (A = the older revision, checked out into a temporary git worktree;
B = this tree, with its uncommitted changes), so that a machine getting slower or faster over
the run tilts both sides alike. Each round is a fresh `python -m labsupport bench` process of the
same interpreter, run from that tree's root (so `import labsupport` finds that tree's package).
The table gives each figure's values in round order and B's mean over A's; "within noise" is
for the reader to judge against the spread between a side's own two rounds, which the table
shows beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
ORDER = "ABBA"


def bench(tree: Path, sections: list[str], out: Path) -> dict:
    """One bench run of `sections` from `tree`'s root; its report's figures, name -> value."""
    try:
        subprocess.run([sys.executable, "-m", "labsupport", "bench", "--sections", *sections, "--out", str(out)],
                       cwd=tree, check=True)
    except subprocess.CalledProcessError as error:
        sys.exit(f"bench_against: the bench round in {tree} failed (exit status {error.returncode}); "
                 f"its own message is above.")
    report = json.loads(out.read_text())
    return {f"{section}: {figure['name']}": figure["value"]
            for section, body in report["sections"].items() if isinstance(body, dict)
            for figure in body.get("figures", []) if isinstance(figure.get("value"), (int, float))}


def spread(values: list[float]) -> float:
    """How far a side's two rounds differ, as a fraction of their mean."""
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / abs(mean) if mean else float("nan")


def require_writable(out: Path) -> None:
    """Stop in one sentence, before the first round, if the report cannot be written to `out`
    (its folder cannot be made, it is a folder, or it is not writable): not after four rounds."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            with open(out, "r+b"):                     # writable, left as it is
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=out.parent):
                pass
    except OSError as error:
        sys.exit(f"bench_against: cannot write --out {out} ({error.strerror or error}); "
                 f"choose a writable file before the four rounds run.")


def add_worktree(revision: str, where: Path) -> None:
    """Check `revision` out into a temporary worktree, or stop in one sentence if git cannot."""
    try:
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(where), revision],
                       check=True, capture_output=True)
    except subprocess.CalledProcessError as error:
        said = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else str(error.stderr or "")
        why = next((line.strip() for line in said.splitlines() if line.strip()), f"exit status {error.returncode}")
        sys.exit(f"bench_against: git cannot check out the revision {revision!r} ({why}); "
                 f"give a commit, tag or branch this repository has (git log --oneline lists them).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the older revision (A), any name git knows")
    parser.add_argument("--sections", nargs="+", required=True, help="bench sections, as `labsupport bench` takes")
    parser.add_argument("--out", type=Path, help="write every round's figures and the table here, as JSON")
    args = parser.parse_args()
    if args.out:
        require_writable(args.out)
    with tempfile.TemporaryDirectory() as scratch:
        old = Path(scratch) / "old"
        add_worktree(args.revision, old)
        try:
            trees = {"A": old, "B": HERE}
            rounds = [(side, bench(trees[side], args.sections, Path(scratch) / f"{i}{side}.json"))
                      for i, side in enumerate(ORDER)]
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(old)], check=True)
    names = [name for name in rounds[0][1] if all(name in figures for _, figures in rounds)]
    rows = []
    print(f"| figure | {' | '.join(side for side, _ in rounds)} | B / A | spread A | spread B |")
    print("|---|" + "---|" * (len(rounds) + 3))
    for name in names:
        values = [figures[name] for _, figures in rounds]
        by_side = {side: [v for (s, _), v in zip(rounds, values) if s == side] for side in "AB"}
        ratio = statistics.fmean(by_side["B"]) / statistics.fmean(by_side["A"]) if statistics.fmean(by_side["A"]) else float("nan")
        rows.append({"figure": name, "values": values, "b_over_a": ratio,
                     "spread_a": spread(by_side["A"]), "spread_b": spread(by_side["B"])})
        print(f"| {name} | {' | '.join(f'{v:.4g}' for v in values)} | {ratio:.3f} | "
              f"{rows[-1]['spread_a']:.1%} | {rows[-1]['spread_b']:.1%} |")
    if args.out:
        args.out.write_text(json.dumps({"revision": args.revision, "order": ORDER, "sections": args.sections,
                                        "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
