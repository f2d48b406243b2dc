"""The hostile tests' guard: a program that wrote outside its jail or left a process behind fails
the test it ran in (the secret each test sets is what a program would try to leak)."""

from __future__ import annotations

import time

import pytest

from hostile.common import ESCAPE, SECRET, _sleepers


@pytest.fixture(autouse=True)
def _secret_and_cleanup(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPD_HOSTILE_SECRET", SECRET)
    ESCAPE.unlink(missing_ok=True)
    yield
    assert not ESCAPE.exists(), "a program wrote outside its sandbox"
    deadline = time.monotonic() + 5
    while _sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleepers() == [], "a program left processes behind"
