"""How labsupport is cut (the course's design, COURSE.md beside this repository: "labsupport: how it is
cut"), checked from the source.

Every module is parsed with `ast`; every import counts, at the top of a module and
inside functions alike, relative (``from .x import y``) and absolute
(``import labsupport.x``). From these imports:

* the import graph between labsupport's modules has no cycle;
* the folders show the architecture (COURSE.md, "labsupport: how it is cut"): engine/
  imports only itself, `errors` and `inputs`; weights/ (getting a model onto the machine)
  adds engine/; lab/ (measuring each technique) adds weights/; the layers built on them
  (bench/, claims/, report, cli, plots/, explorers/, checks/, delivery) may import anything
  below;
* no module is longer than 400 lines;
* every public function and class at the top of a module has a docstring that names the
  notebook introducing it (COURSE.md: "the package is an index of the book").

A cycle or a long file that is known and owned elsewhere is marked ``xfail(strict=True)``
with its name: the mark fails as soon as it is fixed, so that it is removed then.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labsupport"
MAX_LINES = 400

# The folder rule: what each folder may import (besides itself). `errors` and `inputs` sit
# at the bottom, importable by all; everything not named here is a layer built on top.
BASE = ("errors", "inputs")
MAY_IMPORT = {
    "errors": (),
    "inputs": ("errors",),
    "engine": BASE,
    "weights": BASE + ("engine",),
    "lab": BASE + ("engine", "weights"),
}
# Layers built on the engine and the lab: none of the folders above imports them.
LAYERS = ("bench", "claims", "report", "cli", "plots", "explorers", "checks", "delivery", "serve", "__main__")

# Modules over MAX_LINES, owned elsewhere: each one is an xfail until it is split.
KNOWN_LONG: dict[str, str] = {}


def module_name(path: Path) -> str:
    """labsupport/bench/core.py -> labsupport.bench.core; labsupport/bench/__init__.py -> labsupport.bench."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _known(name: str) -> str | None:
    """The labsupport module `name` is, or lies in (a function or class of it); None outside labsupport."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every labsupport module that `source` (the text of `module`) imports, wherever the import stands."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            origin = ".".join(filter(None, [base if node.level else "", node.module or ""]))
            for alias in node.names:                   # `from . import x`: x may be a module
                found.add(_known(f"{origin}.{alias.name}") or _known(origin))
    return found - {None, module}


def imports_of(module: str) -> set[str]:
    """Every labsupport module `module` imports (`imports_in` on its file)."""
    path = MODULES[module]
    return imports_in(path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py")


GRAPH = {module: imports_of(module) for module in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm),
    as a path that starts and ends at the same module."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(graph, component) for component in components]


def _path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle inside `component`, from its first module (breadth-first)."""
    start = min(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:                       # back at the start: walk the path back
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if nxt not in previous:
                    previous[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return sorted(component)


def layer(module: str) -> str:
    """labsupport.bench.core -> bench; labsupport.claims -> claims; labsupport -> ''."""
    return module.split(".")[1] if "." in module else ""


def show(found: list[list[str]]) -> str:
    return "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_graph_sees_every_kind_of_import():
    source = """
import torch
import labsupport.engine.kv_cache
from ..errors import LabError
from ..weights import loading
from . import core, SECTIONS


def late():
    from ..engine.generation import generate
    import labsupport.engine.serving.engine as engine
"""
    assert imports_in(source, "labsupport.bench.suite") == {
        "labsupport.engine.kv_cache", "labsupport.errors", "labsupport.weights.loading", "labsupport.bench.core",
        "labsupport.bench", "labsupport.engine.generation", "labsupport.engine.serving.engine"}
    assert imports_in("from .errors import LabError", "labsupport.bench", is_package=True) == set()
    assert imports_in("from .engine.generation import generate", "labsupport", is_package=True) == {
        "labsupport.engine.generation"}
    assert "labsupport.bench.baseline" in GRAPH["labsupport.bench.suite"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_all():
    found = cycles(GRAPH)
    assert not found, f"import cycle(s): {show(found)}"


def folder_rule_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses the folder rule (`MAY_IMPORT`), as "a imports b"."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items()
                  if layer(module) in MAY_IMPORT for target in targets
                  if layer(target) != layer(module) and layer(target) not in MAY_IMPORT[layer(module)])


def test_the_folder_rule_is_what_the_test_checks():
    """The rule itself, on a made-up graph: each kind of crossing is caught, the allowed ones pass."""
    graph = {"labsupport.engine.a": {"labsupport.engine.b", "labsupport.errors", "labsupport.lab.c"},
             "labsupport.weights.w": {"labsupport.engine.a", "labsupport.lab.c"},
             "labsupport.lab.c": {"labsupport.weights.w", "labsupport.engine.a", "labsupport.bench.core"},
             "labsupport.bench.core": {"labsupport.lab.c", "labsupport.claims"},
             "labsupport.inputs": {"labsupport.errors"}}
    assert folder_rule_breaks(graph) == ["labsupport.engine.a imports labsupport.lab.c",
                                         "labsupport.lab.c imports labsupport.bench.core",
                                         "labsupport.weights.w imports labsupport.lab.c"]


def test_every_module_lives_in_a_folder_of_the_rule_or_a_layer_above():
    """No flat module is left between the folders: each is engine/, weights/, lab/, the two
    bottom modules, or one of the layers built on top."""
    stray = sorted(m for m in MODULES if m != "labsupport" and layer(m) not in MAY_IMPORT and layer(m) not in LAYERS)
    assert not stray, f"modules outside the folders: {stray}"


def test_the_folders_import_only_what_the_rule_allows():
    wrong = folder_rule_breaks(GRAPH)
    assert not wrong, "; ".join(wrong)


# --- the engine only runs a model (issue 39): importing a checkpoint is weights/' job ----------

HUGGING_FACE = ("transformers", "huggingface_hub", "safetensors", "tokenizers", "gguf")


def hugging_face_imports(source: str) -> list[str]:
    """The Hugging Face (or checkpoint-format) packages `source` imports, wherever the import stands,
    and the definitions that translate from them (a name with "hf" as a word in it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        found += [f"imports {name}" for name in names if name.split(".")[0] in HUGGING_FACE]
        if (isinstance(node, (ast.FunctionDef, ast.ClassDef))
                and re.search(r"(^|_)hf(_|$)", node.name.lower())):
            found.append(f"defines {node.name}")
    return found


def test_the_hugging_face_rule_is_what_the_test_checks():
    assert hugging_face_imports("import transformers") == ["imports transformers"]
    assert hugging_face_imports("def f():\n    from safetensors.torch import load_file") == ["imports safetensors.torch"]
    assert hugging_face_imports("def config_from_hf(c): pass") == ["defines config_from_hf"]
    assert hugging_face_imports("import torch\ndef shelf(): pass") == []


def test_nothing_in_the_engine_imports_or_translates_a_hugging_face_checkpoint():
    found = [f"{module}: {what}" for module, path in MODULES.items() if module.startswith("labsupport.engine")
             for what in hugging_face_imports(path.read_text(encoding="utf-8"))]
    assert not found, "model import belongs in labsupport/weights/: " + "; ".join(found)


# --- one owner after each step (issue 39): only the scheduler moves `num_cached` -------------

NUM_CACHED_WRITERS = {
    "labsupport.engine.serving.scheduler": "admission (the prefix cache's hit), preemption, postprocess",
    "labsupport.engine.serving.request": "the constructor: nothing computed yet",
}
# Modules outside the engine that drive a ModelRunner by hand and so stand in for its scheduler.
OWN_SCHEDULERS = {
    "labsupport.lab.tensor_parallel_disaggregated": "the decode worker seats handed-over caches and steps them itself",
    "labsupport.lab.serving_decode_cost": "times one decode step over and over, then moves on by hand",
}


def num_cached_writes(source: str) -> list[int]:
    """The lines of `source` that assign to (or augment) an attribute named num_cached."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and part.attr == "num_cached":
                    lines.append(node.lineno)
    return lines


def test_the_num_cached_rule_is_what_the_test_checks():
    assert num_cached_writes("seq.num_cached += n") == [1]
    assert num_cached_writes("x = 1\nseq.status, seq.num_cached = 0, 0") == [2]
    assert num_cached_writes("n = seq.num_cached + 1") == []


def test_one_writer_of_num_cached():
    found = [f"{module}:{line}" for module, path in MODULES.items()
             if module not in NUM_CACHED_WRITERS and module not in OWN_SCHEDULERS
             for line in num_cached_writes(path.read_text(encoding="utf-8"))]
    assert not found, ("only the scheduler moves num_cached (Scheduler.postprocess after a step); "
                       "the runner computes and moves no counter: " + ", ".join(found))
    assert all(num_cached_writes(MODULES[m].read_text(encoding="utf-8")) for m in OWN_SCHEDULERS), \
        "an exception no longer needed: remove it from OWN_SCHEDULERS"


# --- no attribute of the engine's objects or classes assigned from outside it (issue 39) ---------

ENGINE_OBJECTS = ("pool", "cache", "runner", "engine", "scheduler", "blocks", "graphs", "manager")


def engine_attribute_sets(source: str, module: str) -> list[str]:
    """Assignments in `source` to an attribute of an engine class (a name imported from
    labsupport's engine) or of an object named as the engine's are (ENGINE_OBJECTS)."""
    tree = ast.parse(source)
    engine_names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and "engine" in (node.module or "").split(".") for alias in node.names}
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                        and (part.value.id in engine_names or part.value.id in ENGINE_OBJECTS)):
                    found.append(f"{module}:{node.lineno} sets {part.value.id}.{part.attr}")
    return found


def test_the_engine_attribute_rule_is_what_the_test_checks():
    source = "from ..engine.serving import PagedView\nPagedView.clock = 1\npool.view_class, x = 2, 3\n"
    assert engine_attribute_sets(source, "m") == ["m:2 sets PagedView.clock", "m:3 sets pool.view_class"]
    assert engine_attribute_sets("cache.keys[:, 0] = 1\nrow.x = 2\n", "m") == []


def test_no_attribute_of_the_engine_is_assigned_from_outside_it():
    found = [line for module, path in MODULES.items() if not module.startswith("labsupport.engine")
             for line in engine_attribute_sets(path.read_text(encoding="utf-8"), module)]
    assert not found, ("choose an engine object's parts when it is built (constructor arguments), "
                       "never by assigning them later: " + "; ".join(found))


# --- the cache protocols sit below the model (issue 39): no arrow up into models/ -----------

BELOW_THE_MODEL = ("labsupport.engine.config", "labsupport.engine.kv_cache", "labsupport.engine.kv_quant")


def test_the_config_and_the_cache_protocols_import_nothing_of_the_model():
    up = [f"{module} imports {target}" for module in BELOW_THE_MODEL for target in GRAPH[module]
          if target.startswith(("labsupport.engine.models", "labsupport.engine.serving"))]
    assert not up, "; ".join(up)
    assert any(target.startswith("labsupport.engine.kv_cache") for target in GRAPH["labsupport.engine.models.transformer"])


def _long_file_params():
    for module, path in sorted(MODULES.items()):
        relative = path.relative_to(PACKAGE).as_posix()
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_LONG[relative])] if relative in KNOWN_LONG else []
        yield pytest.param(path, id=relative, marks=marks)


@pytest.mark.parametrize("path", list(_long_file_params()))
def test_modules_stay_short(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_LINES})"


MAX_FUNCTION_LINES = 80        # issue 47: a function a learner reads in one screen; split at the steps it narrates


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in `source` longer than MAX_FUNCTION_LINES,
    counted from its first decorator to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                found.append((node.name, node.end_lineno - first + 1))
    return found


def test_no_function_is_longer_than_a_screen():
    scripts = sorted((PACKAGE.parent / "scripts").glob("*.py"))
    too_long = {str(p.relative_to(PACKAGE.parent)): long_functions(p.read_text(encoding="utf-8"))
                for p in sorted(MODULES.values()) + scripts}
    too_long = {k: v for k, v in too_long.items() if v}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_the_function_length_rule_counts_decorators_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 2))
    short = f"def f():\n{body}\n"
    assert long_functions(short) == []                                       # 79 lines
    assert long_functions("@decorator\n" + short + "    return x0\n") == [("f", MAX_FUNCTION_LINES + 1)]
    nested = "def outer():\n    def inner():\n" + "\n".join("    " + line for line in body.split("\n")) + \
        "\n        return 1\n" * 2 + "    return inner\n"
    assert [name for name, _ in long_functions(nested)] == ["outer", "inner"]


def test_check_means_grading_an_exercise():
    """`check_*` names only the exercise checkers in checks/; validating an input is `require_*`."""
    wrong = sorted(f"{path.relative_to(PACKAGE)}: {node.name}"
                   for path in MODULES.values() if "checks" not in path.relative_to(PACKAGE).parts
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("check_"))
    assert not wrong, "named check_ outside labsupport/checks: " + "; ".join(wrong)


def test_no_module_shares_its_name_with_a_public_function():
    """`import labsupport.engine.generation` is the module; `labsupport.generate` is the function."""
    import labsupport
    clashes = [name for name in labsupport.__all__ if f"labsupport.{name}" in MODULES]
    assert not clashes, f"labsupport.{clashes[0]} is both a module and a public name of the package"


NOTEBOOK = re.compile(r"notebooks? \d\d", re.IGNORECASE)      # "Notebook 04", "notebooks 00-07"


def test_every_public_definition_names_its_notebook():
    """d2l's rule: every public function and class says which notebook introduces it (or, for
    infrastructure, which notebooks use it), e.g. "Notebook 04 (quantization)."."""
    missing = sorted(f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                     for path in MODULES.values()
                     for node in ast.parse(path.read_text(encoding="utf-8")).body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and not node.name.startswith("_")
                     and not NOTEBOOK.search(ast.get_docstring(node) or ""))
    assert not missing, (f"{len(missing)} public definition(s) whose docstring names no notebook "
                         f"(add e.g. 'Notebook 04 (quantization).'): " + ", ".join(missing))


def test_every_folder_of_modules_is_a_package():
    """A folder of modules without __init__.py imports from a checkout (a namespace package), but
    setuptools' find_packages leaves it out of a wheel: `pip install git+...` (Colab) would lack it."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(PACKAGE.parent)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"folders without __init__.py: {missing}"


# --- one entrance to the model (COURSE.md: "nothing outside sets attributes on a model, calls
# its layer loop, or flips a class attribute"; issue 27) ---------------------------------------

MODEL_FOLDER = "labsupport.engine.models"
PRIVATE_LOOPS = ("_layers", "run_layers", "decode_static")          # the layer loop, old names too
MODEL_NAMES = ("model", "target")                                    # how the code names a Transformer
# Assignments the rule would catch that are not on labsupport's model, each with its reason.
NOT_OUR_MODEL = {"labsupport.bench.peers.huggingface": "a Hugging Face model's layer list (the early-layers draft)"}


def entrance_breaks(source: str, module: str) -> list[str]:
    """Every place in `source` that goes around the model's one entrance (`forward`, `logits`,
    `with_attention_window`): a call of its layer loop, a hook on its output layer, an attribute
    set on a model object or on the Transformer class."""
    if module.startswith(MODEL_FOLDER):
        return []
    found = []

    def is_model(node) -> bool:
        return ((isinstance(node, ast.Name) and node.id in MODEL_NAMES)
                or (isinstance(node, ast.Attribute) and node.attr in MODEL_NAMES)
                or (isinstance(node, ast.Name) and node.id == "Transformer"))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_LOOPS:
            found.append(f"{module}:{node.lineno} calls the layer loop ({node.attr})")
        if (isinstance(node, ast.Attribute) and node.attr.startswith("register_")
                and isinstance(node.value, ast.Attribute) and node.value.attr == "lm_head"):
            found.append(f"{module}:{node.lineno} hooks lm_head")
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for item in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(item, ast.Attribute) and is_model(item.value) and module not in NOT_OUR_MODEL:
                    found.append(f"{module}:{node.lineno} sets {ast.unparse(item)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and node.args and is_model(node.args[0])):
            found.append(f"{module}:{node.lineno} calls setattr on {ast.unparse(node.args[0])}")
    return sorted(found, key=lambda line: int(line.split(":")[1].split(" ")[0]))


def test_the_entrance_rule_is_what_the_test_checks():
    source = """
model.run_layers(ids, positions, view, mask)
self.model._layers(ids, positions, view, mask)
hook = self.model.lm_head.register_forward_pre_hook(lambda *a: None)
model._compiled_decode = torch.compile(step)
Transformer.attention_window = 8
target.config, other = config, 1
setattr(model, "_compile_failed", "no triton")
cache.length = 3
logits = model.logits(model(tokens, positions, cache, mask), at=-1)
model.register_forward_hook(count)
"""
    assert [line.split(" ", 1)[1] for line in entrance_breaks(source, "labsupport.lab.x")] == [
        "calls the layer loop (run_layers)", "calls the layer loop (_layers)", "hooks lm_head",
        "sets model._compiled_decode", "sets Transformer.attention_window", "sets target.config",
        "calls setattr on model"]
    assert entrance_breaks(source, "labsupport.engine.models.transformer") == []


def test_everything_goes_through_the_models_one_entrance():
    tests = Path(__file__).resolve().parent
    sources = {module: path for module, path in MODULES.items()}
    sources.update({f"tests.{p.stem}": p for p in sorted(tests.rglob("*.py")) if p.name != Path(__file__).name})
    found = [line for module, path in sources.items()
             for line in entrance_breaks(path.read_text(encoding="utf-8"), module)]
    assert not found, "; ".join(found)


def test_only_the_cache_moves_its_length():
    """`KVCache.reserve` (and `truncate`, the rollback) in kv_cache.py move a cache's length;
    elsewhere a cache only sets it to 0 when it is made, and nobody calls an `advance`."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, ast.AugAssign) else [])
                for target in targets:
                    for item in (target.elts if isinstance(target, ast.Tuple) else [target]):
                        sets_length = isinstance(item, ast.Attribute) and item.attr == "length"
                        if sets_length and module != "labsupport.engine.kv_cache" and function.name != "__init__":
                            found.append(f"{module}:{node.lineno} in {function.name}")
                if isinstance(node, ast.Attribute) and node.attr == "advance":
                    found.append(f"{module}:{node.lineno} calls advance")
    assert not found, "a cache's length moved outside kv_cache.py: " + "; ".join(found)
