"""How the course reaches people: Colab badges and setup cells, student versions.

Not introduced by a notebook: this module writes the notebooks' first cells, and
instructors use it to hand out exercises (see docs/instructors.md). Its commands are
part of the one command line (`labsupport.cli`; each takes --root, default here):

    python -m labsupport badges [--repo OWNER/NAME] [--branch main]
        rewrite every notebook's "Open in Colab" badge and setup cell, and the README's
        badge table, from the templates below (idempotent; --repo also updates REPO here)
    python -m labsupport check
        exit 1 if a notebook or the README is not what `badges` would write
    python -m labsupport student --out student/
        student versions of every notebook: solutions replaced by a stub that raises
        NotImplementedError, outputs cleared (nbgrader's ClearSolutions + ClearOutput)

``python -m labsupport.delivery ...`` still works: it runs ``python -m labsupport ...``.

The repository slug lives in one place, `REPO` below. Every notebook's badge and
install line, and the README's badges, are generated from it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable, Mapping

from .errors import LabError

# The GitHub repository the course is published from: the one place the slug lives.
# Change it with `python -m labsupport badges --repo OWNER/NAME`, which also
# rewrites every badge and install cell.
REPO = "OWNER/REPO"
BRANCH = "main"

COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE_IMAGE = "https://mybinder.org/badge_logo.svg"
SETUP_CELL_ID = "colab-setup"
SETUP_MARKER = "# Setup: on Google Colab this installs the course's package, labsupport, if it is missing."
README_START = "<!-- delivery:badges:start (written by python -m labsupport badges) -->"
README_END = "<!-- delivery:badges:end -->"
STUB_MESSAGE = "Exercise: replace this line with your solution"
CODE_STUB = f'# YOUR CODE HERE\nraise NotImplementedError("{STUB_MESSAGE}")'

_SLUG = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_BADGE_LINE = re.compile(r"^\[!\[Open In Colab\]\(.*\)\]\(.*\)\s*$")


# --------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------


def require_slug(repo: str) -> str:
    """`repo` if it is a GitHub OWNER/NAME slug, else a `LabError`. Notebooks 00-07: their badges."""
    if not _SLUG.match(repo):
        raise LabError(f"{repo!r} is not a GitHub repository slug; give it as OWNER/NAME.")
    return repo


def colab_url(notebook: str, repo: str = REPO, branch: str = BRANCH) -> str:
    """Colab's URL for notebooks/<notebook> on GitHub (Colab opens it straight from the repository).
    Notebooks 00-07: their badges."""
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/notebooks/{notebook}"


def colab_badge(notebook: str, repo: str = REPO, branch: str = BRANCH) -> str:
    """The "Open in Colab" badge of notebooks/<notebook> (notebooks 00-07 and the README)."""
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(notebook, repo, branch)})"


def binder_url(repo: str = REPO, branch: str = BRANCH) -> str:
    """mybinder.org builds binder/environment.yml + binder/postBuild and opens JupyterLab on notebooks/.
    Notebooks 00-07 at once."""
    return f"https://mybinder.org/v2/gh/{repo}/{branch}?urlpath=lab/tree/notebooks"


def binder_badge(repo: str = REPO, branch: str = BRANCH) -> str:
    """The README's Binder badge: notebooks 00-07 at once."""
    return f"[![Binder]({BINDER_BADGE_IMAGE})]({binder_url(repo, branch)})"


def install_spec(repo: str = REPO, branch: str = BRANCH) -> str:
    """What the Colab setup cell gives pip: the package straight from the repository.

    pyproject asks only for torch>=2.11 (the oldest torch CI tests), so pip keeps Colab's own
    CUDA build where it is 2.11 or newer.
    Notebooks 00-07: their setup cell.
    """
    return f"labsupport @ git+https://github.com/{repo}@{branch}"


# --------------------------------------------------------------------------
# The setup cell: the first code cell of every notebook
# --------------------------------------------------------------------------


def needs_install(modules: Mapping | None = None,
                  find_spec: Callable[[str], object] | None = None) -> bool:
    """True on Colab when labsupport is not importable yet: the setup cell's decision.

    The cell itself cannot import this (it runs before labsupport is installed), so it
    repeats these two lines; tests check that both agree.
    Notebooks 00-07: their setup cell.
    """
    modules = sys.modules if modules is None else modules
    find_spec = importlib.util.find_spec if find_spec is None else find_spec
    return "google.colab" in modules and find_spec("labsupport") is None


def setup_cell_source(repo: str = REPO, branch: str = BRANCH) -> str:
    """The notebooks' first code cell. Self-contained until labsupport is importable. Notebooks 00-07."""
    return f'''{SETUP_MARKER}
# Colab's own torch is kept. Elsewhere, install the course first (README: make install).
import importlib.util, sys
if "google.colab" in sys.modules and importlib.util.find_spec("labsupport") is None:
    %pip install -q "{install_spec(repo, branch)}"
    importlib.invalidate_caches()
elif importlib.util.find_spec("labsupport") is None:
    raise ModuleNotFoundError("labsupport is not installed for this kernel: run `make install` in the "
                              "course's folder and choose the .venv's Python, or see the README.")

import labsupport as ls
from labsupport.delivery import describe_runtime

ls.notebook_setup()                      # a labsupport error shows as one sentence, not a traceback
print(describe_runtime())                # where this notebook runs: device, dtype, torch'''


def describe_runtime(device=None) -> str:
    """One line saying where the notebook runs: platform, device, default dtype, bf16, torch.

    Printed by every notebook's setup cell, so a learner (and whoever helps them) sees at
    once whether the GPU was picked up. The device is `hardware.pick_device`'s choice.
    Notebooks 00-07 print it.
    """
    import torch

    from . import __version__
    from .engine.hardware import attention_note, bf16_supported, device_name, pick_device

    device = pick_device(device)
    where = "Google Colab" if "google.colab" in sys.modules else "this machine"
    bf16 = "yes" if bf16_supported(device) else "no"
    fusion = ""
    if device.type == "cpu":                  # the CPU's fused norm/RoPE kernels (engine/models/fused.py)
        from .engine.models import fused
        reason = fused.unavailable()
        fusion = ", fused norm and RoPE kernels: " + ("yes" if reason is None else f"no ({reason})")
    return (f"Running on {where}: device {device.type} ({device_name(device)}), models in float32 "
            f"and decode steps eager unless a cell says otherwise (compile=True), bf16 in hardware: {bf16}"
            f"{fusion}{attention_note(device)} | torch {torch.__version__}, labsupport {__version__}")


def _strip_setup_lines(source: str) -> str:
    """Drop `import labsupport as ls` / `ls.notebook_setup()` lines the setup cell now runs."""
    kept: list[str] = []
    skip_blank = False
    for line in source.split("\n"):
        if line.split("#", 1)[0].strip() in ("import labsupport as ls", "ls.notebook_setup()"):
            skip_blank = not kept or kept[-1].strip() == ""     # no double blank line left behind
            continue
        if skip_blank and line.strip() == "":
            skip_blank = False
            continue
        skip_blank = False
        kept.append(line)
    while kept and kept[0].strip() == "":
        kept.pop(0)
    return "\n".join(kept)


def with_badge(title_source: str, badge: str) -> str:
    """The title cell with the Colab badge on the line after the heading (replaced if present).
    Notebooks 00-07: their title cells."""
    lines = title_source.split("\n")
    for index, line in enumerate(lines):
        if _BADGE_LINE.match(line):
            lines[index] = badge
            return "\n".join(lines)
    heading = next((i for i, line in enumerate(lines) if line.startswith("# ")), 0)
    lines[heading + 1:heading + 1] = ["", badge]
    return "\n".join(lines)


def apply_delivery_cells(nb, notebook_name: str, repo: str = REPO, branch: str = BRANCH) -> bool:
    """Write the badge and the setup cell into a notebook (an nbformat node). True if it changed.
    Notebooks 00-07."""
    import nbformat

    before = nbformat.writes(nb)
    title = nb.cells[0]
    if title.cell_type != "markdown":
        raise LabError(f"{notebook_name}: the first cell must be the markdown title cell.")
    title.source = with_badge(title.source, colab_badge(notebook_name, repo, branch))

    first_code = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"), None)
    if first_code is None:
        raise LabError(f"{notebook_name} has no code cell; a course notebook needs one for its setup cell.")
    cell = nb.cells[first_code]
    if cell.source.startswith(SETUP_MARKER):
        cell.source = setup_cell_source(repo, branch)
    else:
        cell.source = _strip_setup_lines(cell.source)
        setup = nbformat.v4.new_code_cell(setup_cell_source(repo, branch))
        setup.id = SETUP_CELL_ID
        nb.cells.insert(first_code, setup)
    return nbformat.writes(nb) != before


def notebook_title(nb) -> str:
    """'Where the time goes' from a title cell '# 00 · Where the time goes' (or '# 06b · ...').
    Notebooks 00-09 (and 06b): the README's table."""
    heading = next((line for line in nb.cells[0].source.split("\n") if line.startswith("# ")), "# ?")
    return re.sub(r"^#\s*\d+[a-z]?\s*[·:.-]?\s*", "", heading).strip()


def readme_block(notebooks: list[tuple[str, str]], repo: str = REPO, branch: str = BRANCH) -> str:
    """The README's badge table: one row per notebook, plus the Binder badge. Notebooks 00-09 (and 06b)."""
    rows = [README_START,
            f"Everything at once on Binder (CPU, JupyterLab): {binder_badge(repo, branch)}",
            "",
            "| # | notebook | open it in Colab |",
            "|---|---|---|"]
    for name, title in notebooks:
        rows.append(f"| {name.split('_')[0]} | {title} | {colab_badge(name, repo, branch)} |")     # 06, 06b
    rows.append(README_END)
    return "\n".join(rows)


def with_readme_block(readme: str, block: str) -> str:
    """`readme` with its badge block (README_START ... README_END) replaced by `block` (notebooks 00-07)."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise LabError(f"README.md has no badge block; put the two lines {README_START} and {README_END} "
                       "where the table of Colab badges should go.")
    return readme[:start] + block + readme[end + len(README_END):]


def set_repo_constant(module_source: str, repo: str, branch: str) -> str:
    """This module's source with REPO and BRANCH set (so the slug keeps living in one place).
    Notebooks 00-07: their badges."""
    source = re.sub(r'^REPO = ".*"$', f'REPO = "{repo}"', module_source, count=1, flags=re.M)
    return re.sub(r'^BRANCH = ".*"$', f'BRANCH = "{branch}"', source, count=1, flags=re.M)


def _notebook_paths(root: Path) -> list[Path]:
    paths = sorted((root / "notebooks").glob("[0-9]*.ipynb"))
    if not paths:
        raise LabError(f"No notebooks under {root / 'notebooks'}; run this from the repository root "
                         "or give --root.")
    return paths


def write_badges(root: Path, repo: str = REPO, branch: str = BRANCH, dry_run: bool = False) -> list[Path]:
    """Apply the templates to every notebooks/NN_*.ipynb and the README; return the files that changed.
    Notebooks 00-07."""
    import nbformat

    require_slug(repo)
    changed, titles = [], []
    for path in _notebook_paths(root):
        text = path.read_text(encoding="utf-8")
        nb = nbformat.reads(text, as_version=4)
        apply_delivery_cells(nb, path.name, repo, branch)
        titles.append((path.name, notebook_title(nb)))
        new_text = nbformat.writes(nb) + "\n"
        if new_text != text:
            changed.append(path)
            if not dry_run:
                path.write_text(new_text, encoding="utf-8")
    readme = root / "README.md"
    if not readme.is_file():
        raise LabError(f"No README.md in {root}; run this from the repository root or give --root.")
    text = readme.read_text(encoding="utf-8")
    new_text = with_readme_block(text, readme_block(titles, repo, branch))
    if new_text != text:
        changed.append(readme)
        if not dry_run:
            readme.write_text(new_text, encoding="utf-8")
    return changed


# --------------------------------------------------------------------------
# Student versions (nbgrader's own ClearSolutions, in-process, no course directory)
# --------------------------------------------------------------------------


def is_solution_cell(cell) -> bool:
    """True for a cell nbgrader marks as a solution (the exercises of notebooks 00-07)."""
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def student_version(nb, name: str = "this notebook"):
    """A student copy of an instructor notebook: solutions -> stub, outputs cleared.

    Uses nbgrader's ClearSolutions (the preprocessor behind `nbgrader generate_assignment`)
    with a stub that says what to do, then nbconvert's ClearOutput. nbgrader metadata is
    kept, so nbgrader can still collect and grade the submissions. Markup nbgrader refuses
    (an unclosed or nested solution region, one outside a solution cell, a kernel other
    than Python) is a `LabError` naming `name`.
    Notebooks 00-07: their exercises.
    """
    import copy

    try:
        from nbgrader.preprocessors import ClearSolutions
    except ImportError:
        raise LabError("nbgrader is not installed: pip install -e '.[instructor]' "
                         "(it provides the ClearSolutions step).") from None
    from nbconvert.preprocessors import ClearOutputPreprocessor

    nb = copy.deepcopy(nb)
    resources: dict = {}
    try:
        nb, resources = ClearSolutions(code_stub={"python": CODE_STUB}, enforce_metadata=True).preprocess(nb, resources)
    except (RuntimeError, ValueError) as error:        # nbgrader's words for bad markup
        raise LabError(f"{name}: nbgrader cannot make a student version ({error}); mark each solution "
                       "with # BEGIN SOLUTION / # END SOLUTION inside a cell marked as a solution.") from None
    nb, resources = ClearOutputPreprocessor().preprocess(nb, resources)
    return nb


def write_student_versions(root: Path, out: Path) -> list[Path]:
    """Student versions of every notebook under root/notebooks, written to `out`. Notebooks 00-07."""
    import nbformat

    paths = _notebook_paths(root)
    if out.exists() and not out.is_dir():
        raise LabError(f"{out} is a file, not a folder; give a folder for the student notebooks (--out).")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        try:
            teacher = nbformat.read(path, as_version=4)
        except (ValueError, OSError) as error:          # not JSON, not a notebook, unreadable
            raise LabError(f"{path} is not a readable notebook ({type(error).__name__}); "
                           "restore it from git.") from None
        nb = student_version(teacher, path.name)
        nbformat.validate(nb)
        target = out / path.name
        target.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        written.append(target)
    return written


# --------------------------------------------------------------------------
# The commands (`labsupport.cli` parses them: python -m labsupport badges|check|student)
# --------------------------------------------------------------------------


def command_badges(root: Path, repo: str | None = None, branch: str | None = None) -> int:
    """``python -m labsupport badges``: store a new slug in REPO (if given), rewrite every badge.
    Notebooks 00-07."""
    repo = require_slug(repo or REPO)
    branch = branch or BRANCH
    if (repo, branch) != (REPO, BRANCH):
        module = root / "labsupport" / "delivery.py"          # this file, in the repository given
        module = module if module.is_file() else Path(__file__)
        module.write_text(set_repo_constant(module.read_text(encoding="utf-8"), repo, branch), encoding="utf-8")
        print(f"REPO = {repo!r}, BRANCH = {branch!r} stored in {module}")
    changed = write_badges(root, repo, branch)
    print(f"{len(changed)} file(s) rewritten" + "".join(f"\n  {p}" for p in changed))
    return 0


def command_check(root: Path) -> int:
    """``python -m labsupport check``: 1 if a notebook or the README is not what `badges` would write.
    Notebooks 00-07."""
    stale = write_badges(root, dry_run=True)
    if stale:
        print("Stale (run python -m labsupport badges):" + "".join(f"\n  {p}" for p in stale))
        return 1
    print("Badges and setup cells are up to date.")
    return 0


def command_student(root: Path, out: Path) -> int:
    """``python -m labsupport student --out student``: `write_student_versions`, and say where.
    Notebooks 00-07."""
    written = write_student_versions(root, out)
    print(f"{len(written)} student notebook(s) in {out}/")
    return 0


if __name__ == "__main__":        # the old command: python -m labsupport.delivery ... = python -m labsupport ...
    import runpy
    runpy.run_module("labsupport", run_name="__main__", alter_sys=True)
