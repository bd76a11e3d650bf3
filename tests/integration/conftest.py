"""The integration suite's own session fixture: one warm server per test process, shared by
its local sweeps (tests/support/warm_server.py)."""

from tests.support.warm_server import shared_warm_server  # noqa: F401 (autouse, session scope)
