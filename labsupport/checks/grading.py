"""Grading by what the learner's code reaches and does, never by names (issue 48).

Introduced in notebook 00 (where the time goes); every checker of notebooks 00-10 grades through it.

A learner's notebook imports the whole engine, so "do not call the answer" cannot be a list of
names. Each exercise declares, once, the quantity it teaches (`Exercise`). Its deny list follows:

* every callable of the layers above the engine (labsupport.lab, explorers, claims, bench, plots,
  checks, report, serve, delivery, cli): they compute the course's figures, the checkers' own
  references and slips among them, and no exercise needs one unless it says so (`allowed`);
* the engine's and the weights' callables that compute the same quantity (`computed_by`);
* the methods and computed properties of the package's objects the checker passes in (`receives`:
  a `ModelConfig`'s `decode_flops`, `num_parameters`, ...), except those the method needs (`allowed`).

Before the checker runs anything, `reach.reach` walks everything the learner's function can reach
(its globals, closure cells, defaults, helpers, the attributes its code reads). A denied callable
it reaches is refused in one sentence that names it and the path to it.
While the checker runs, every denied function and received method is replaced by a stand-in that
refuses a call from the learner's code (what no walk can see: `getattr` with a built name, `eval`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import types
from typing import Callable, Iterator

from . import CheckFailed
from .reach import Attribute, reach

UPPER_LAYERS = tuple(f"labsupport.{name}" for name in
                     ("lab", "explorers", "claims", "bench", "plots", "checks", "report", "serve", "delivery", "cli"))
# frames that only pass a call along: a stand-in looks past them for the code that made the call
WRAPPER_MODULES = ("torch", "functools", "contextlib", "importlib", "typing", "abc")


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One graded exercise: its title, the quantity it teaches, and the package code that computes
    that quantity. Paths are dotted ("labsupport.engine.config.ModelConfig.decode_flops"), resolved
    when grading starts. Notebook 00 (where the time goes)."""

    title: str                                   # as the checker's messages name it: "decode step cost"
    teaches: str                                 # "the FLOPs and bytes of one decode step"
    computed_by: tuple[str, ...] = ()            # engine / weights callables that compute it
    receives: tuple[str, ...] = ()               # classes of the package objects passed to the learner's code
    allowed: tuple[str, ...] = ()                # package callables or attributes the method itself needs

    def denied(self) -> "DenyList":
        return _deny_list(self)


EXERCISES: dict[str, Exercise] = {}              # checker name -> its exercise: every checker registers here


def _resolve(path: str):
    """The object at a dotted path: a module, then attributes ("a.b.C.method" -> C's attribute)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = inspect.getattr_static(obj, name) if isinstance(obj, type) else getattr(obj, name)
        return obj
    raise ImportError(f"no module in {path!r}")


@dataclasses.dataclass
class DenyList:
    """What one exercise refuses: callables by identity, attributes of received classes by name.
    Notebook 00 (where the time goes)."""
    exercise: Exercise
    callables: dict[int, str]                    # id(obj) -> its qualified name
    attributes: dict[str, str]                   # attribute name -> "Class.attribute"
    allowed_ids: set[int]
    classes: list[type]

    def refuses(self, obj) -> str | None:
        """The qualified name of `obj` if the exercise refuses it, else None."""
        target = getattr(obj, "__func__", obj)
        if id(target) in self.allowed_ids:
            return None
        if id(target) in self.callables:
            return self.callables[id(target)]
        module = getattr(target, "__module__", None) or ""
        if callable(target) and module.startswith(UPPER_LAYERS):
            return f"{module}.{getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
        return None


@functools.cache
def _deny_list(exercise: Exercise) -> DenyList:
    allowed = {id(_unwrap(_resolve(p))) for p in exercise.allowed}
    allowed_names = {p.rsplit(".", 1)[-1] for p in exercise.allowed}
    callables = {id(_unwrap(_resolve(p))): p.removeprefix("labsupport.") for p in exercise.computed_by}
    attributes, classes = {}, []
    for path in exercise.receives:
        cls = _resolve(path)
        classes.append(cls)
        for name, member in denied_members(cls):
            if name not in allowed_names:
                attributes[name] = f"{cls.__name__}.{name}"
                callables[id(_unwrap(member))] = f"{cls.__name__}.{name}"
    return DenyList(exercise, callables, attributes, allowed, classes)


def _unwrap(obj):
    """The function behind a property, staticmethod, classmethod or bound method."""
    if isinstance(obj, property):
        return obj.fget
    return getattr(obj, "__func__", obj)


def denied_members(cls: type) -> Iterator[tuple[str, object]]:
    """The public methods and properties `cls` and its labsupport bases define (not torch's).
    Notebook 00 (where the time goes)."""
    seen = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("labsupport"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(member, (property, staticmethod, classmethod, types.FunctionType)):
                seen.add(name)
                yield name, member


def refusal(exercise: Exercise, name: str, how: str | None = None) -> CheckFailed:
    """The one sentence a refused call gets. Notebook 00 (where the time goes)."""
    name = name.removeprefix("labsupport.")
    where = f" (reached through {how})" if how and " -> " in how else ""
    return CheckFailed(f"{exercise.title}: expected your own code, got a call of the package's {name}{where}. "
                       f"Hint: this exercise rebuilds {exercise.teaches}; write those steps without {name}.")


def first_refused(exercise: Exercise, fn) -> CheckFailed | None:
    """The refusal for the first denied package object `fn` can reach, or None.
    Notebook 00 (where the time goes)."""
    deny = exercise.denied()
    for how, obj in reach(fn):
        if isinstance(obj, Attribute):
            if obj.name in deny.attributes:
                return refusal(exercise, deny.attributes[obj.name], how)
            continue
        name = deny.refuses(obj)
        if name is not None:
            return refusal(exercise, name, how)
    return None


# --- while the checker runs: stand-ins -------------------------------------------------------

def _called_by_learner() -> bool:
    """True when the nearest frame that is not a stand-in or a wrapper (torch, functools, ...) runs
    code outside labsupport: the learner's code, in a notebook or a test module."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == __name__ or module.startswith(WRAPPER_MODULES):
            frame = frame.f_back
            continue
        return not (module == "labsupport" or module.startswith("labsupport."))
    return False


class _Refused(CheckFailed):
    """Raised inside the learner's code by a stand-in (a CheckFailed, so that the checkers' own
    handling of the learner's errors lets it through); the checker turns it into the refusal."""


def _stand_in(fn, name: str, calls: list):
    @functools.wraps(fn)
    def refusing(*args, **kwargs):
        if _called_by_learner():
            calls.append(name)
            raise _Refused(name)
        return fn(*args, **kwargs)
    return refusing


def _modules_that_may_hold_them() -> list[types.ModuleType]:
    """labsupport's modules, the notebook's namespace (`__main__`) and the learner's own modules: not
    the standard library's or an installed package's, which never import the package's answers."""
    found = []
    for name, module in list(sys.modules.items()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict):
            continue
        if name == "__main__" or name == "labsupport" or name.startswith("labsupport."):
            found.append(module)
            continue
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if name.split(".")[0] in sys.stdlib_module_names or "-packages" in origin or origin in ("built-in", "frozen"):
            continue
        found.append(module)
    return found


def _patch_functions(deny: DenyList, calls: list) -> list[tuple[dict, str, object]]:
    """Replace every denied plain function, in every module's namespace (`__main__` too), by a stand-in."""
    targets = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith(UPPER_LAYERS) and module_name not in ("labsupport.checks", __name__):
            for value in list(vars(module).values()):
                if isinstance(value, types.FunctionType) and value.__module__ == module_name:
                    targets[id(value)] = value
    for obj_id, name in deny.callables.items():
        targets.setdefault(obj_id, None)
    stand_ins, patched = {}, []
    for module in _modules_that_may_hold_them():
        names = vars(module)
        for key, value in list(names.items()):
            if isinstance(value, types.FunctionType) and id(value) in targets and deny.refuses(value):
                if id(value) not in stand_ins:
                    stand_ins[id(value)] = _stand_in(value, deny.refuses(value), calls)
                names[key] = stand_ins[id(value)]
                patched.append((names, key, value))
    return patched


def _patch_members(deny: DenyList, calls: list) -> list[tuple[type, str, object]]:
    """Replace by refusing stand-ins, on the classes that define them: every denied method and property
    of the received classes, every method and property named in `computed_by`, and the constructor
    of every class named there (so `Int8KVCache(...)` built by a name no walk can read is refused,
    while the class itself, and isinstance on it, stay what they are)."""
    targets = []                                                    # (owner class, attribute name, label)
    for cls in deny.classes:
        targets += [(cls, name, deny.attributes[name]) for name, _ in denied_members(cls) if name in deny.attributes]
    for path in deny.exercise.computed_by:
        obj = _resolve(path)
        label = path.removeprefix("labsupport.")
        if isinstance(obj, type):
            targets.append((obj, "__init__", label))
        elif "." in path and isinstance(_resolve(path.rsplit(".", 1)[0]), type):
            targets.append((_resolve(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1], label))
    patched = []
    for cls, name, label in targets:
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        member = vars(owner).get(name) if owner is not None else None
        if isinstance(member, property):
            replacement = property(_stand_in(member.fget, label, calls))
        elif isinstance(member, types.FunctionType):
            replacement = _stand_in(member, label, calls)
        else:
            continue                                                # object's __init__, a slot: nothing to wrap
        if name == "__init__":
            owner = cls                                             # the constructor of this class only
        patched.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, replacement)
    return patched


_MISSING = object()


def graded(exercise: Exercise):
    """Wrap a checker: refuse, before anything runs, a learner's function that reaches a denied package
    callable; then run the checker with every denied callable replaced by a stand-in that refuses the
    learner's calls. Registers the exercise under the checker's name. Notebook 00 (where the time goes)."""
    def decorate(check: Callable):
        @functools.wraps(check)
        def checked(*args, **kwargs):
            for value in list(args) + list(kwargs.values()):
                if callable(value) or isinstance(value, (list, tuple, dict)):
                    refused = first_refused(exercise, value)
                    if refused is not None:
                        raise refused
            deny, calls = exercise.denied(), []
            functions, members = _patch_functions(deny, calls), _patch_members(deny, calls)
            try:
                result = check(*args, **kwargs)
            except BaseException as error:
                if calls:
                    raise refusal(exercise, calls[0]) from None
                raise error
            finally:
                for names, key, value in functions:
                    names[key] = value
                for owner, name, member in reversed(members):
                    if member is _MISSING:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, member)
            if calls:                                              # the learner caught the refusal
                raise refusal(exercise, calls[0])
            return result
        EXERCISES[check.__name__] = exercise
        checked.exercise = exercise
        return checked
    return decorate
