"""One exception type for every mistake a learner can make.

A `LabError` carries one sentence that says what went wrong and what to do.
The command line prints only that sentence. In IPython and Jupyter the error
renders as that sentence too (`_render_traceback_`, IPython's hook for
exceptions that draw their own traceback), yet it is still a real error: the
cell fails, execution stops, and nbval, nbclient and nbgrader's autograder all
see it as an error.
"""


class LabError(Exception):
    """A user-facing error: one sentence that says what to do. Raised throughout notebooks 00-07."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows in place of the traceback: the class and the sentence."""
        return [f"{type(self).__name__}: {self}"]


class ModelUnavailable(LabError):
    """The requested model cannot be had on this machine (no hub, unknown name).
    Raised by `load_model`, from notebook 00 (where the time goes) on."""


class UnsupportedDtype(LabError):
    """The device cannot run the requested dtype (for example bf16 on a T4).
    Raised by `hardware.as_dtype` and `require_usable_dtype`, from notebook 00 (where the time goes) on."""


class MissingPackage(LabError):
    """An optional package is needed for this feature and is not installed.
    Raised for bitsandbytes (notebook 04) and the embedded model's converters (notebook 00)."""


def require_package(module: str, pip_name: str | None = None, feature: str = "this feature"):
    """Import an optional package, or raise `MissingPackage` with the pip command to get it.
    Used for bitsandbytes (notebook 04) and the embedded model's converters (notebook 00)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackage(
            f"{feature} needs the optional package '{pip_name or module}'; "
            f"install it with: pip install {pip_name or module}"
        ) from None


def first_line(error: BaseException, limit: int = 160, with_type: bool = False) -> str:
    """An exception's gist for the middle of a sentence: its first line, stripped of a final
    period and cut to `limit` characters (with "..."); the exception's type name when its
    message is empty. with_type: "TypeName: first line" (for errors from other libraries,
    whose type tells as much as their message).

    Used wherever notebooks 00-08 put another library's error into one sentence (a fast
    kernel that fell back, a compile that failed, a checkpoint that cannot be read)."""
    lines = str(error).strip().splitlines()
    text = lines[0].strip().rstrip(".") if lines else ""
    if len(text) > limit:
        text = text[: max(limit - 3, 1)] + "..."
    if not text:
        return type(error).__name__
    return f"{type(error).__name__}: {text}" if with_type else text
