"""The check the start-up tests share (test_startup, test_startup_imports): which of a set of
loaded modules are login-node packages (pipeline.job.startup.LOGIN_NODE_ONLY) a rank must not
import."""

from __future__ import annotations

from pipeline.job.startup import LOGIN_NODE_ONLY


def login_only(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in LOGIN_NODE_ONLY))
