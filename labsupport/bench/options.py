"""What every section's options share: one small validated dataclass per section, kept beside it.

Introduced in notebook 00 (where the time goes); each notebook's section adds its own
(`baseline.BaselineOptions`, `kv_cache.KVCacheOptions`, ... ; `suite.BenchOptions` holds one of
each, by section name).

A section's options are a frozen dataclass built on `SectionOptions`: its defaults are the
CPU preset (small: a 2-core machine runs every section in about a quarter of an hour), and
`gpu()` takes the sizes that differ on a GPU from `workloads.PRESETS`, the course's one home
for sizes. Every field is declared with its kind (`count`, `counts`, `switch`, `seconds`,
`names`) and checked when an instance is made (also by `dataclasses.replace`); rules that
tie two fields together are the class's `check`. A wrong value is one sentence (`LabError`)
naming the section and the field, never a traceback from deep inside a section after the
models have loaded. `with_counts` applies the command line's ``--new-tokens`` and
``--repeats`` to the fields they stand for.
"""

from __future__ import annotations

from dataclasses import asdict, field, fields, replace
from typing import ClassVar

from ..errors import LabError
from ..inputs import finite_number, whole_number
from ..lab.workloads import device_class


def count(default: int, minimum: int = 1):
    """A whole-number field of at least `minimum`. Introduced in notebook 00 (where the time goes)."""
    return field(default=default, metadata={"kind": "count", "minimum": minimum})


def counts(default: tuple[int, ...]):
    """A field holding a non-empty list of whole numbers of at least 1, kept as a tuple.
    Introduced in notebook 00 (where the time goes)."""
    return field(default=tuple(default), metadata={"kind": "counts"})


def switch(default: bool):
    """A True/False field. Introduced in notebook 00 (where the time goes)."""
    return field(default=default, metadata={"kind": "switch"})


def seconds(default: float):
    """A finite number of seconds, at least 0. Introduced in notebook 01 (KV cache)."""
    return field(default=default, metadata={"kind": "seconds"})


def names(default: tuple[str, ...], allowed: tuple[str, ...]):
    """A non-empty list of names from `allowed`, kept as a tuple. Introduced in notebook 07."""
    return field(default=tuple(default), metadata={"kind": "names", "allowed": tuple(allowed)})


class SectionOptions:
    """The base of every section's options (each a frozen dataclass of `count`, `counts`, ...
    fields). Introduced in notebook 00 (where the time goes).

    SECTION: the section's name in `suite.SECTIONS`, used in every message. Subclasses
    override `check` for rules across fields and `gpu_sizes` for the sizes a GPU changes.
    """

    SECTION: ClassVar[str] = "section"

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, self._valid(f, getattr(self, f.name)))
        self.check()

    def _valid(self, f, value):
        name, kind = f"{self.SECTION}.{f.name}", f.metadata.get("kind")
        if kind == "count":
            return whole_number(value, name, minimum=f.metadata["minimum"])
        if kind == "switch":
            if not isinstance(value, bool):
                raise LabError(f"{name} must be True or False, got {value!r}.")
            return value
        if kind == "seconds":
            return finite_number(value, name, minimum=0.0)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise LabError(f"{name} must be a list, got {value!r}.")
        values = tuple(value)
        if not values:
            raise LabError(f"{name} needs at least one value.")
        if kind == "names":
            wrong = [v for v in values if v not in f.metadata["allowed"]]
            if wrong:
                raise LabError(f"{name} takes names from {list(f.metadata['allowed'])}, got {wrong}.")
            return values
        return tuple(whole_number(v, f"every value of {name}") for v in values)

    def check(self) -> None:
        """Rules that tie two fields together (none here); raise `LabError` in one sentence."""

    def refuse(self, sentence: str) -> None:
        """Raise `LabError` with `sentence`, prefixed by the section's name."""
        raise LabError(f"{self.SECTION} options: {sentence}")

    # -- presets ------------------------------------------------------------------------
    @classmethod
    def gpu_sizes(cls) -> dict:
        """The fields a GPU sets differently (from `workloads.PRESETS["gpu"]`); none here."""
        return {}

    @classmethod
    def cpu(cls, **changes):
        """The CPU preset (the defaults), with `changes`. Introduced in notebook 00."""
        return cls(**changes)

    @classmethod
    def gpu(cls, **changes):
        """The GPU preset (`gpu_sizes` over the defaults), with `changes`. Introduced in notebook 00."""
        return cls(**{**cls.gpu_sizes(), **changes})

    @classmethod
    def for_device(cls, device, **changes):
        """`gpu()` on a CUDA device, `cpu()` anywhere else. Introduced in notebook 00."""
        return cls.gpu(**changes) if device_class(device) == "gpu" else cls.cpu(**changes)

    # -- the command line and the JSON -----------------------------------------------------
    def with_counts(self, new_tokens: int | None = None, repeats: int | None = None):
        """These options with the command line's ``--new-tokens`` on the field ``new_tokens``
        and ``--repeats`` on every field whose name ends in ``repeats`` (None: unchanged).
        Introduced in notebook 00 (where the time goes)."""
        changes = {}
        for f in fields(self):
            if new_tokens is not None and f.name == "new_tokens":
                changes[f.name] = new_tokens
            if repeats is not None and f.name.endswith("repeats"):
                changes[f.name] = repeats
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field, lists as lists: what a report's ``"options"`` holds for this section.
        Introduced in notebook 00 (where the time goes)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
