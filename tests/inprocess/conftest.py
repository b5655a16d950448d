"""Fixtures of the in-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.raftcluster import Cluster


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    """Three real replicas in this thread, ticked by the test (tests/support/raftcluster.py)."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
