"""The emulated two-node cluster as a session fixture (built by shoal/testing/emulated_cluster.py)."""

from __future__ import annotations

import pytest

from shoal.testing.emulated_cluster import cannot_make_namespaces, emulated_cluster


@pytest.fixture(scope="session")
def cluster():
    """Two nodes, a and b, joined by a veth pair shaped to RATE; yields a Cluster."""
    why = cannot_make_namespaces()
    if why:
        pytest.skip(f"no emulated cluster: {why}")
    with emulated_cluster() as made:
        yield made
