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
