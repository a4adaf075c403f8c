"""Sliding-window attention for a block of code: each query sees at most the last W keys.

Introduced in notebook 08 (long context). The window is a mask over the full cache,
which still holds every position (lab/long_context.py measures what it saves and costs).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


from ..errors import LabError


@contextmanager
def attention_window(model, window: int | None) -> Iterator[None]:
    """Within the block, each of `model`'s queries sees at most the last `window` keys (None:
    all of them); restored afterwards. Introduced in notebook 08 (long context)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise LabError(f"window must be a whole number of at least 1 (or None), got {window!r}.")
    before = model.attention_window
    model.attention_window = window
    try:
        yield
    finally:
        model.attention_window = before
