"""Mutation testing of every exercise checker (issue 48): how many wrong versions of the notebook's own
solution does each checker refuse?

    python scripts/checker_mutants.py                  every exercise: its score, and the mutants it let through
    python scripts/checker_mutants.py --only ID ...    some exercises (the grade ids of their solution cells)
    python scripts/checker_mutants.py --json FILE      the scores and every mutant's outcome, as JSON

For each exercise the solution cell is read from its notebook and mutated inside its ### BEGIN / END
SOLUTION lines, one change at a time (`MUTATORS`): an arithmetic or comparison operator swapped, an
integer constant moved by one, a slice bound moved by one, two call arguments swapped, a term dropped,
`and`/`or` swapped, `min`/`max` and `any`/`all` swapped, a `not` or a minus dropped, a boolean flipped.
Each mutant's cell is run (its imports and definitions only) in a namespace holding the notebook's
imports, and its functions are handed to the exercise's checker as the notebook's check cell hands the
solution's. A mutant is refused when the checker raises (a CheckFailed, or the mutant's own error) or
runs past `TIMEOUT_S`; it survives when the checker accepts it.

Some mutants compute exactly what the solution computes (`x * 2` for `x + x`, a bound no input reaches):
those are listed, each with the reason, in the notebook's module of tests/checker_cases/ (its
`EQUIVALENT_MUTANTS`) and left out of the score. Score = refused / (mutants - equivalent). tests/test_checker_mutants.py holds every checker at 95%.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import dataclasses
import io
import json
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TIMEOUT_S = 60                        # a mutant that loops forever is refused when its checker runs past this
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


# --- the exercises: solution cells and their check cells -----------------------------------------

@dataclasses.dataclass
class Exercise:
    """One graded exercise: its notebook, the solution cell's grade id and source, the lines of it that
    are solution (1-based, inclusive), the check cell's source, and the notebook's import statements."""
    notebook: str
    grade_id: str
    source: str
    regions: list[tuple[int, int]]
    check: str
    imports: str

    @property
    def id(self) -> str:
        return self.grade_id


def _code(cell) -> str:
    return "\n".join(line for line in "".join(cell["source"]).splitlines()
                     if not line.lstrip().startswith(("%", "!")))


def _imports(cells) -> str:
    """Every top-level import statement of `cells` (the notebook's setup and import cells)."""
    found = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_code(cell))
        except SyntaxError:
            continue
        found += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(found))


def exercises(notebooks=None) -> list[Exercise]:
    """Every exercise of the course's notebooks: a solution cell followed by its graded check cell."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        if notebooks and path.name.split("_")[0] not in notebooks:
            continue
        cells = json.loads(path.read_text())["cells"]
        for index, cell in enumerate(cells):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell["cell_type"] != "code" or not meta.get("solution") or BEGIN not in "".join(cell["source"]):
                continue
            check = next((c for c in cells[index + 1:] if c["cell_type"] == "code"
                          and c.get("metadata", {}).get("nbgrader", {}).get("grade")), None)
            source = _code(cell)
            lines = source.splitlines()
            begins = [i + 1 for i, line in enumerate(lines) if BEGIN in line]
            ends = [i + 1 for i, line in enumerate(lines) if END in line]
            found.append(Exercise(path.name.split("_")[0], meta["grade_id"], source, list(zip(begins, ends)),
                                  _code(check) if check else "", _imports(cells[:index])))
    return found


# --- the mutants ---------------------------------------------------------------------------------

SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
              ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr,
              ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.MatMult: ast.Mult}
SWAP_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_NAMES = {"min": "max", "max": "min", "any": "all", "all": "any"}


@dataclasses.dataclass
class Mutant:
    """One change: where (line, column in the cell), what kind, and the changed cell's source."""
    exercise: str
    line: int
    col: int
    kind: str
    detail: str
    source: str

    @property
    def id(self) -> str:
        return f"{self.exercise}:{self.line}:{self.col}:{self.kind}:{self.detail}"


def _in_regions(node, regions) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and any(begin < line < end for begin, end in regions)


def _changes(node) -> list[tuple[str, str, callable]]:
    """The single-node changes MUTATORS can make to `node`: (kind, detail, apply) where apply(node)
    returns the replacement node."""
    out = []
    if isinstance(node, ast.BinOp):
        new = SWAP_BINOP.get(type(node.op))
        if new:
            out.append(("operator", f"{type(node.op).__name__}->{new.__name__}",
                        lambda n, new=new: ast.BinOp(n.left, new(), n.right)))
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)):
            out.append(("drop-term", "keep-left", lambda n: n.left))
            out.append(("drop-term", "keep-right", lambda n: n.right))
    elif isinstance(node, ast.AugAssign):
        new = SWAP_BINOP.get(type(node.op))
        if new:
            out.append(("operator", f"augmented-{type(node.op).__name__}->{new.__name__}",
                        lambda n, new=new: ast.AugAssign(n.target, new(), n.value)))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            new = SWAP_COMPARE.get(type(op))
            if new:
                out.append(("compare", f"{i}-{type(op).__name__}->{new.__name__}",
                            lambda n, i=i, new=new: ast.Compare(n.left, n.ops[:i] + [new()] + n.ops[i + 1:],
                                                                n.comparators)))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append(("boolean", f"{type(node.op).__name__}->{new.__name__}", lambda n, new=new: ast.BoolOp(new(), n.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        out.append(("unary", f"drop-{type(node.op).__name__}", lambda n: n.operand))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        out.append(("constant", f"{node.value}->{not node.value}", lambda n: ast.Constant(not n.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        out.append(("constant", f"{node.value}+1", lambda n: ast.Constant(n.value + 1)))
        out.append(("constant", f"{node.value}-1", lambda n: ast.Constant(n.value - 1)))
    elif isinstance(node, ast.Constant) and type(node.value) is float:
        out.append(("constant", f"{node.value}*2", lambda n: ast.Constant(n.value * 2)))
    elif isinstance(node, ast.Slice):
        for bound in ("lower", "upper"):
            if getattr(node, bound) is not None:
                for delta, name in ((1, "+1"), (-1, "-1")):
                    out.append(("slice", f"{bound}{name}", lambda n, b=bound, d=delta: _shift(n, b, d)))
                out.append(("slice", f"drop-{bound}", lambda n, b=bound: _drop(n, b)))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id in SWAP_NAMES:
            out.append(("name", f"{node.func.id}->{SWAP_NAMES[node.func.id]}",
                        lambda n: ast.Call(ast.Name(SWAP_NAMES[n.func.id], ast.Load()), n.args, n.keywords)))
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        for i in range(len(positional) - 1):
            if ast.dump(positional[i]) != ast.dump(positional[i + 1]):
                out.append(("swap-arguments", f"{i}<->{i + 1}", lambda n, i=i: _swap(n, i)))
    return out


def _shift(node, bound, delta):
    new = copy.deepcopy(node)
    value = getattr(new, bound)
    setattr(new, bound, ast.BinOp(value, ast.Add(), ast.Constant(delta)))
    return new


def _drop(node, bound):
    new = copy.deepcopy(node)
    setattr(new, bound, None)
    return new


def _swap(node, i):
    new = copy.deepcopy(node)
    new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
    return new


def mutants(exercise: Exercise) -> list[Mutant]:
    """Every single-change mutant of the exercise's solution lines, in source order."""
    tree = ast.parse(exercise.source)
    targets = [node for node in ast.walk(tree) if _in_regions(node, exercise.regions)]
    found = []
    for index, node in enumerate(targets):
        for kind, detail, apply in _changes(node):
            mutated = copy.deepcopy(tree)
            target = [n for n in ast.walk(mutated) if _in_regions(n, exercise.regions)][index]
            replacement = apply(target)
            if not _replace(mutated, target, replacement):
                continue
            try:
                source = ast.unparse(ast.fix_missing_locations(mutated))
            except Exception:                                       # noqa: BLE001 - an unprintable change
                continue
            found.append(Mutant(exercise.id, node.lineno, node.col_offset, kind, detail, source))
    unique = {}
    for mutant in found:                                            # two changes that print the same code are one
        unique.setdefault((mutant.source, mutant.kind), mutant)
    return list(unique.values())


def _replace(tree, target, replacement) -> bool:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, field, replacement)
                return True
            if isinstance(value, list) and any(v is target for v in value):
                setattr(parent, field, [replacement if v is target else v for v in value])
                return True
    return False


# --- running a mutant against its checker --------------------------------------------------------

class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    def ring(signum, frame):
        raise _Timeout()
    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_NAMESPACES: dict[str, dict] = {}


def _namespace(exercise: Exercise) -> dict:
    """The notebook's imports, run once per exercise, copied for every mutant."""
    if exercise.id not in _NAMESPACES:
        namespace = {"__name__": "__main__"}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(exercise.imports, f"<{exercise.notebook} imports>", "exec"), namespace)   # noqa: S102
        _NAMESPACES[exercise.id] = namespace
    return dict(_NAMESPACES[exercise.id])


def _definitions(source: str) -> str:
    """What the check needs of the cell: its imports, definitions and constants, without its prints; a
    cell that defines no function (an exercise whose answer is a value) runs whole."""
    tree = ast.parse(source)
    if not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body):
        return source
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
            or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant))]
    return ast.unparse(ast.Module(keep, type_ignores=[]))


def _source_file(exercise: Exercise, source: str) -> str:
    """A file holding the cell's definitions, so that a checker that reads a function's source (06b's
    hash check runs it in a fresh process) finds it, as it would in a notebook."""
    import hashlib
    import tempfile
    folder = Path(tempfile.gettempdir()) / "checker-mutants"
    folder.mkdir(exist_ok=True)
    path = folder / f"{exercise.id}-{hashlib.sha1(source.encode()).hexdigest()[:12]}.py"
    path.write_text(_definitions(source))
    return str(path)


def run(exercise: Exercise, source: str, call) -> tuple[str, str]:
    """("refused" | "accepted", what the checker said) for the cell `source` handed to `call(namespace)`."""
    from labsupport.checks import CheckFailed
    namespace = _namespace(exercise)
    prepare, check = call if isinstance(call, tuple) else (None, call)
    out = io.StringIO()
    try:
        with _time_limit(TIMEOUT_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            if prepare is not None:
                prepare(namespace)                                     # the notebook's state the cell reads
            exec(compile(_definitions(source), _source_file(exercise, source), "exec"), namespace)   # noqa: S102
            check(namespace)
    except CheckFailed as error:
        return "refused", str(error).splitlines()[0][:300]
    except _Timeout:
        return "refused", f"ran past {TIMEOUT_S} s"
    except Exception as error:                                         # noqa: BLE001 - the mutant's own error
        return "refused", f"{type(error).__name__}: {error}"[:300]
    return ("accepted" if "Correct" in out.getvalue() else "refused"), out.getvalue().strip()[:300]


def _case_modules():
    import importlib
    import pkgutil

    import checker_cases
    return [importlib.import_module(f"checker_cases.{m.name}") for m in pkgutil.iter_modules(checker_cases.__path__)
            if m.name.startswith("nb")]


def equivalent_mutants() -> dict[str, dict[str, str]]:
    """grade id -> {mutant key: why it computes what the solution computes}, from every notebook's
    module of tests/checker_cases/ (`EQUIVALENT_MUTANTS`)."""
    found = {}
    for module in _case_modules():
        for grade_id, entries in getattr(module, "EQUIVALENT_MUTANTS", {}).items():
            found.setdefault(grade_id, {}).update(entries)
    return found


def call_for(exercise: Exercise):
    """How the checker is handed a mutant's cell: as the notebook's check cell hands it the solution's
    functions (the checker's own defaults for the notebook's data), unless the notebook's module of
    tests/checker_cases/ says otherwise in its `MUTATION_CALLS` (an exercise whose answer is a value:
    (prepare(namespace), check(namespace)))."""
    for module in _case_modules():
        calls = getattr(module, "MUTATION_CALLS", {})
        if exercise.id in calls:
            return calls[exercise.id]
    call = next(n for n in ast.walk(ast.parse(exercise.check)) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id.startswith("check_"))
    defined = {n.name for n in ast.parse(exercise.source).body if isinstance(n, ast.FunctionDef)}
    names = [a.id for a in call.args if isinstance(a, ast.Name) and a.id in defined]
    imports = "\n".join(ast.unparse(n) for n in ast.parse(exercise.check).body
                        if isinstance(n, (ast.Import, ast.ImportFrom)))

    def check(namespace):
        exec(compile(imports, f"<{exercise.id} check imports>", "exec"), namespace)   # noqa: S102
        namespace[call.func.id](*[namespace[name] for name in names])
    return check


@dataclasses.dataclass
class Score:
    exercise: str
    mutants: int
    equivalent: int
    refused: int
    survivors: list[str]
    stale_equivalents: list[str]
    seconds: float

    @property
    def score(self) -> float:
        counted = self.mutants - self.equivalent
        return self.refused / counted if counted else 1.0


def score(exercise: Exercise, limit: int | None = None, progress=None) -> Score:
    """Run every mutant (or the first `limit`, spread over the solution) of one exercise."""
    call = call_for(exercise)
    started = time.perf_counter()
    reference, said = run(exercise, exercise.source, call)
    if reference != "accepted":
        raise RuntimeError(f"{exercise.id}: the checker refuses the notebook's own solution: {said}")
    every = mutants(exercise)
    chosen = every if limit is None or limit >= len(every) else every[:: max(1, len(every) // limit)][:limit]
    equivalent = equivalent_mutants().get(exercise.id, {})
    refused, survivors, stale, skipped = 0, [], [], 0
    for mutant in chosen:
        outcome, said = run(exercise, mutant.source, call)
        key = f"{mutant.line}:{mutant.col}:{mutant.kind}:{mutant.detail}"
        if key in equivalent:
            skipped += 1
            if outcome == "refused":
                stale.append(f"{key} (listed equivalent, refused: {said})")
            continue
        if outcome == "refused":
            refused += 1
        else:
            survivors.append(key)
        if progress:
            progress(mutant, outcome)
    return Score(exercise.id, len(chosen), skipped, refused, survivors, stale, time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="GRADE_ID", help="these exercises only")
    parser.add_argument("--notebooks", nargs="+", metavar="NN", help="these notebooks only (00, 06b, ...)")
    parser.add_argument("--limit", type=int, help="at most this many mutants per exercise (spread over it)")
    parser.add_argument("--json", help="write every score here")
    args = parser.parse_args(argv)
    found = [e for e in exercises(args.notebooks) if not args.only or e.id in args.only]
    rows, worst = [], 1.0
    for exercise in found:
        result = score(exercise, args.limit)
        rows.append(result)
        worst = min(worst, result.score)
        print(f"{result.score:6.1%}  {exercise.notebook:>3} {exercise.id:32s} {result.refused:4d} refused of "
              f"{result.mutants - result.equivalent:4d} ({result.equivalent} equivalent)  {result.seconds:6.1f} s",
              flush=True)
        for key in result.survivors:
            print(f"        survived: {key}")
        for line in result.stale_equivalents:
            print(f"        stale: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) | {"score": r.score} for r in rows], indent=1))
    return 0 if worst >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
