"""Where labsupport keeps what it builds once: converted models and compiled kernels.

Introduced in notebook 00 (where the time goes).
"""

from __future__ import annotations

import os
from pathlib import Path



def cache_root() -> Path:
    """Where labsupport keeps converted models (LABSUPPORT_CACHE overrides; ~ is expanded).

    Introduced in notebook 00 (where the time goes).
    """
    value = os.environ.get("LABSUPPORT_CACHE", "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "labsupport"
