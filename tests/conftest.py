"""Shared fixtures: a temporary cluster of real node processes, cleaned up always."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Nodes without a configured secret leave pointers to their generated secret for the
# local clients (raftsched.wire.secretfile); this run's go to a private temp dir, not
# the user's home. Node processes inherit it.
os.environ.setdefault("RAFTSCHED_RUNTIME_DIR", tempfile.mkdtemp(prefix="rs-runtime-"))


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
