"""The fast tier runs the daemon in the test's own process: what it changes of the
process (its environment) must not reach the next test, which may start real daemons
(a finished flag left in the environment once made every later daemon of the worker
exit at once)."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

OWN = "PYTEST_CURRENT_TEST"  # pytest's own, set per phase
BEFORE = pytest.StashKey[dict[str, str]]()


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != OWN}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[BEFORE] = _environ()  # before any fixture (monkeypatch's included) ran
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    result = yield  # every fixture finalised: monkeypatch has restored what it changed
    before, after = item.stash.get(BEFORE, None), _environ()
    if before is not None and after != before:
        for key in after.keys() - before.keys():
            del os.environ[key]
        os.environ.update(before)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        raise AssertionError(f"the test left the process environment changed: {changed}")
    return result
