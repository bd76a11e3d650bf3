"""The integration suite's own fixture: one warm server per test process, shared by its local
sweeps (tests/support/warm_server.py), started by the first test that may run one: any test but
a Slurm one (a Slurm test's ranks start as Slurm starts them), the paced and timed ones
included (their pace is a local sweep's)."""

from __future__ import annotations

import pytest

from tests.support.warm_server import shared_warm_server  # noqa: F401 (session scope, below)


@pytest.fixture(autouse=True)
def _warm_server_for_local_sweeps(request: pytest.FixtureRequest) -> None:
    if (
        request.node.get_closest_marker("slurm") is None
        or request.node.get_closest_marker("timed") is not None
        or request.node.get_closest_marker("paced") is not None
    ):
        request.getfixturevalue("shared_warm_server")
