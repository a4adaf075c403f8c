"""Lines of Python: code, docstrings, comments, blank (docstrings = module/class/function string literals).

    python scripts/count_lines.py PATH...      one line of counts for the .py files under the paths
    python scripts/count_lines.py --goals      the engine's size goals against its peers, a markdown table
    python scripts/count_lines.py --readme     that table written into README.md (between its markers)
    python scripts/count_lines.py --checks     the engine's `if ...: raise` blocks: how many, their code lines,
                                               and the whole engine's ratio were every one of them gone

The size goals (issue 39) set each subsystem of labsupport/engine beside the file of nano-vllm or
gpt-fast that does the same job, in code lines counted the same way. The peers' counts are
constants (this script runs offline), each with the commit it was counted at.
tests/test_count_lines.py checks that the README's table is the one this script writes.
"""
import ast
import io
import pathlib
import sys
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- engine sizes: start (python scripts/count_lines.py --readme) -->", "<!-- engine sizes: end -->"

NANO_VLLM = "nano-vllm bb823b3"          # GeeeekExplorer/nano-vllm, 2026-04-26
GPT_FAST = "gpt-fast 32971d3"            # pytorch-labs/gpt-fast, 2024-09-15
# (subsystem, our paths under labsupport/engine, the peer's file, its code lines, the goal: at most x times)
GOALS = [
    ("serving", ["serving"], f"{NANO_VLLM}: nanovllm/engine/", 561, 1.5),
    ("the decoder", ["models/transformer.py"], f"{GPT_FAST}: model.py", 227, 1.2),
    ("the loop (generate, compiled steps, sampling, speculative decoding)",
     ["generation.py", "compiled.py", "sampling.py", "speculative.py", "drafts.py"], f"{GPT_FAST}: generate.py", 379, 1.5),
    ("quantization", ["quant"], f"{GPT_FAST}: quantize.py", 441, 1.3),
    ("the engine as a whole", ["."], f"{NANO_VLLM}: nanovllm/", 1195, 2.3),
]


def count(path):
    src = pathlib.Path(path).read_text()
    lines = src.splitlines()
    doc_lines = set()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    comment_lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
    code = doc = comment = blank = 0
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            blank += 1
        elif i in doc_lines:
            doc += 1
        elif s.startswith('#'):
            comment += 1
        else:
            code += 1
    return code, doc, comment, blank


def totals(paths) -> list[int]:
    """[code, docstrings, comments, blank] over the .py files under `paths`."""
    tot = [0, 0, 0, 0]
    for root in paths:
        root = pathlib.Path(root)
        for p in sorted(root.rglob('*.py')) if root.is_dir() else [root]:
            if '__pycache__' in p.parts:
                continue
            tot = [a + b for a, b in zip(tot, count(p))]
    return tot


def check_blocks(path) -> tuple[int, int]:
    """(blocks, code lines) of the `if ...: raise ...` statements with no else in one file
    (issue 47's item 5: how much turning checks into asserts could save at most)."""
    blocks = lines = 0
    for node in ast.walk(ast.parse(pathlib.Path(path).read_text())):
        if isinstance(node, ast.If) and not node.orelse and [type(s) for s in node.body] == [ast.Raise]:
            blocks, lines = blocks + 1, lines + node.end_lineno - node.lineno + 1
    return blocks, lines


def checks_summary() -> str:
    """The engine's check blocks, and its ratio to nano-vllm with and without them."""
    engine = ROOT / "labsupport" / "engine"
    found = [check_blocks(p) for p in sorted(engine.rglob("*.py")) if "__pycache__" not in p.parts]
    blocks, lines = sum(b for b, _ in found), sum(n for _, n in found)
    ours, (_, _, _, peer_lines, goal) = totals([engine])[0], GOALS[-1]
    return (f"{blocks} `if ...: raise` blocks in labsupport/engine, {lines:,} of its {ours:,} code lines; "
            f"{ours / peer_lines:.2f}x nano-vllm now, {(ours - lines) / peer_lines:.2f}x were every one gone "
            f"(goal <= {goal}x)")


def goals_table() -> str:
    """The size goals as a markdown table: ours, the peer's, the ratio and whether it is met."""
    engine = ROOT / "labsupport" / "engine"
    rows = ["| subsystem (labsupport/engine/) | code lines | the peer | its code lines | ratio | goal | met |",
            "|---|---|---|---|---|---|---|"]
    for name, paths, peer, peer_lines, goal in GOALS:
        ours = totals([engine / p for p in paths])[0]
        where = ", ".join(p if p != "." else "all of it" for p in paths)
        ratio = ours / peer_lines
        rows.append(f"| {name}: {where} | {ours:,} | {peer} | {peer_lines:,} | {ratio:.2f}x | <= {goal}x | "
                    f"{'yes' if ratio <= goal else '**no**'} |")
    return "\n".join(rows)


def readme_with_table(readme: str, table: str) -> str:
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no engine-size block: put the lines {START} and {END} where it goes.")
    return readme[:start] + START + "\n" + table + "\n" + readme[end:]


if __name__ == '__main__':
    if sys.argv[1:] == ["--goals"]:
        print(goals_table())
    elif sys.argv[1:] == ["--checks"]:
        print(checks_summary())
    elif sys.argv[1:] == ["--readme"]:
        README.write_text(readme_with_table(README.read_text(), goals_table()))
        print(f"wrote the engine's size goals into {README}")
    else:
        tot = totals(sys.argv[1:])
        print(f"code {tot[0]}  docstrings {tot[1]}  comments {tot[2]}  blank {tot[3]}  total {sum(tot)}")
