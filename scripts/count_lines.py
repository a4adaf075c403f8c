"""Lines of Python: code, docstrings, comments, blank (docstrings = module/class/function string literals)."""
import ast, io, sys, tokenize, pathlib
def count(path):
    src = pathlib.Path(path).read_text()
    lines = src.splitlines()
    doc_lines = set()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    comment_lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
    code = doc = comment = blank = 0
    for i, l in enumerate(lines, 1):
        s = l.strip()
        if not s: blank += 1
        elif i in doc_lines: doc += 1
        elif s.startswith('#'): comment += 1
        else: code += 1
    return code, doc, comment, blank
if __name__ == '__main__':
    tot = [0, 0, 0, 0]
    for root in sys.argv[1:]:
        for p in sorted(pathlib.Path(root).rglob('*.py')) if pathlib.Path(root).is_dir() else [pathlib.Path(root)]:
            if '__pycache__' in p.parts: continue
            c = count(p); tot = [a + b for a, b in zip(tot, c)]
    print(f"code {tot[0]}  docstrings {tot[1]}  comments {tot[2]}  blank {tot[3]}  total {sum(tot)}")
