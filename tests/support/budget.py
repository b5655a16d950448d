"""Hypothesis budgets. Each property names its thorough budget, what CI runs (the
``ci`` profile, the default); ``HYPOTHESIS_PROFILE=dev`` (the fast loop) runs a tenth
of it, never fewer than :data:`DEV_FLOOR` examples. The profiles are registered in
``tests/conftest.py``."""

from __future__ import annotations

import os

#: The share of each budget the dev profile runs, and its floor.
DEV_SHARE = 10
DEV_FLOOR = 5


def examples(thorough: int) -> int:
    """``max_examples`` for a property whose CI budget is ``thorough``."""
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "dev":
        return min(thorough, max(DEV_FLOOR, thorough // DEV_SHARE))
    return thorough
