"""Shared fixtures: a temporary cluster of real node processes, cleaned up always."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cluster_factory(tmp_path):
    """Build :class:`tests.integration.harness.Cluster` objects; all are closed at the end."""
    from tests.integration.harness import Cluster

    made = []

    def make(n: int = 3, **kw):
        c = Cluster(str(tmp_path), n, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
