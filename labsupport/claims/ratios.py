"""Whether a measured speed ratio says faster, slower, or no measurable difference.

Introduced in notebook 06 (continuous batching); notebook 07's claims use it too.
"""

from __future__ import annotations

MARGIN = 1.05          # a ratio at least this large is "faster"; at most 1 / MARGIN, "slower"


def compare_speed(ratio: float, margin: float = MARGIN) -> str:
    """ "faster" when `ratio` (new / old speed) is `margin` or more, "slower" at 1 / margin or
    less, else "same": a difference this small is within a quiet machine's noise.

    Introduced in notebook 06 (continuous batching).
    """
    if ratio >= margin:
        return "faster"
    return "same" if ratio > 1 / margin else "slower"
