"""What a learner's function can reach: the walk behind grading by reach (labsupport/checks/grading.py).

Introduced in notebook 00 (where the time goes); every checker of notebooks 00-10 grades through it.

`reach(fn)` yields every package object the function can get to without running: the globals its code
names (and, for a module it names, the attributes its code names: `ls.lab.roofline.x`), its closure
cells, its default and keyword-default arguments, the parts of a `functools.partial` or a bound method,
the items of containers among them, and, recursively, the learner's own helpers and classes; and an
`Attribute` for every attribute its code reads (`config.decode_flops`, `getattr(config, "name")`).
It never runs the learner's code.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import sys
import sysconfig
import types
from typing import Iterator

_INSTALLED = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})

def _is_package(obj) -> bool:
    module = getattr(obj, "__module__", None) or (obj.__name__ if isinstance(obj, types.ModuleType) else "")
    return isinstance(module, str) and (module == "labsupport" or module.startswith("labsupport."))


def _is_library(obj) -> bool:
    """A function or class of the standard library or of an installed library (torch, numpy, ...): none of
    them imports the package, so the walk does not go into them (nn.Linear's methods lead to thousands of
    torch objects and none of ours)."""
    if not isinstance(obj, (types.FunctionType, type)) or _is_package(obj):
        return False
    top = (getattr(obj, "__module__", None) or "").split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return True
    path = getattr(sys.modules.get(top), "__file__", None) or ""
    return path.startswith(_INSTALLED)


def _code_names(code: types.CodeType) -> set[str]:
    """Every global and attribute name a code object and the code nested in it mentions."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


ATTRIBUTE_READS = {"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"}


def _attribute_names(code: types.CodeType) -> set[str]:
    """The attribute names a code object (and the code nested in it) reads, `obj.name`, and its string
    constants, which `getattr(obj, "name")` reads by."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ATTRIBUTE_READS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _attribute_names(const)
        elif isinstance(const, str) and const.isidentifier():
            names.add(const)
    return names


def reach(fn, limit: int = 2000) -> Iterator[tuple[str, object]]:
    """(how, obj) for every package object the learner's `fn` can reach, and ("attribute", name) for
    every attribute name its code reads. `how` is the path: "step_cost -> helper -> default x".
    Notebook 00 (where the time goes)."""
    seen: set[int] = set()
    stack = [(getattr(fn, "__name__", "your function"), fn)]
    while stack and len(seen) < limit:
        how, obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType) or _is_library(obj):
            continue                                           # a module: its named attributes are walked; a library: not ours
        if isinstance(obj, Attribute):
            yield how, obj
            continue
        if _is_package(obj):
            yield how, obj
            if callable(obj) and not isinstance(obj, type):
                continue                                       # a package callable: what it calls is the package's
        stack.extend(_children(how, obj))


def _children(how: str, obj) -> list[tuple[str, object]]:
    """What one object leads to: for a learner's function, its globals, modules' named attributes,
    closure, defaults; for a partial or bound method, its parts; for a container, its items."""
    out = []
    if isinstance(obj, functools.partial):
        out += [(f"{how} -> partial", obj.func)] + [(f"{how} -> partial argument", a) for a in obj.args]
        out += [(f"{how} -> partial argument {k}", v) for k, v in obj.keywords.items()]
    elif isinstance(obj, types.MethodType):
        out += [(how, obj.__func__), (f"{how} -> its object", obj.__self__)]
    elif isinstance(obj, (types.FunctionType, types.LambdaType)):
        out += _function_children(how, obj)
    elif isinstance(obj, type) and not _is_package(obj):
        out += [(f"{how}.{name}", member) for name, member in vars(obj).items()
                if isinstance(member, (types.FunctionType, staticmethod, classmethod, property))]
        out += [(f"{how} base", base) for base in obj.__bases__ if base is not object]
    elif isinstance(obj, (staticmethod, classmethod)):
        out.append((how, obj.__func__))
    elif isinstance(obj, property):
        out += [(how, f) for f in (obj.fget, obj.fset) if f is not None]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out += [(how, item) for item in list(obj)[:200]]
    elif isinstance(obj, dict):
        out += [(how, item) for item in list(obj.values())[:200]]
    elif callable(obj) and not _is_package(type(obj)) and type(obj).__module__ not in ("builtins",):
        out.append((f"{how}()", type(obj)))                      # a learner's callable object: its class
    return out


def _function_children(how: str, fn) -> list[tuple[str, object]]:
    names = _code_names(fn.__code__)
    out = [(f"{how} -> .{name}", Attribute(name)) for name in _attribute_names(fn.__code__)]
    namespace, modules = fn.__globals__, []
    for name in names:
        if "." in name:                                          # `import a.b.c` / `from a.b import c` inside
            module = sys.modules.get(name)
            if module is not None:
                modules.append((name, module))
        if name in namespace:
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                modules.append((name, value))
            else:
                out.append((f"{how} -> {name}", value))
    for label, module in modules:                                # ls.lab.roofline.decode_cost: follow the names
        out += _module_attributes(f"{how} -> {label}", module, names)
    cells = fn.__closure__ or ()
    out += [(f"{how} -> closure {var}", cell.cell_contents)
            for var, cell in zip(fn.__code__.co_freevars, cells) if _cell_is_set(cell)]
    out += [(f"{how} -> default argument", value) for value in fn.__defaults__ or ()]
    out += [(f"{how} -> default argument {k}", v) for k, v in (fn.__kwdefaults__ or {}).items()]
    return out


def _module_attributes(how: str, module, names: set[str], depth: int = 0) -> list[tuple[str, object]]:
    out = []
    for name in names:
        value = getattr(module, name, None) if depth < 6 else None
        if value is None:
            continue
        if isinstance(value, types.ModuleType):
            if value is not module:
                out += _module_attributes(f"{how}.{name}", value, names, depth + 1)
        else:
            out.append((f"{how}.{name}", value))
    return out


def _cell_is_set(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:                                           # an empty cell: the variable is not bound yet
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Attribute:
    """An attribute name the learner's code reads, whatever object it reads it from.
    Notebook 00 (where the time goes)."""
    name: str
