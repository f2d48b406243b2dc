"""ServerWatch's restart path without a server: what runs after the embedded server is restarted."""

from __future__ import annotations

import asyncio

import pytest


def test_after_a_restart_the_hooks_run_so_a_trainer_loads_its_weights_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.serving import watch as watch_module
    from opd.serving.watch import ServerLost, ServerWatch

    events: list[str] = []

    class Local:
        log_path = "server.log"

        def restart(self) -> str:
            events.append("restart")
            return "http://127.0.0.1:1/v1"

    async def reload() -> None:
        events.append("reload the trained weights")

    monkeypatch.setattr(watch_module, "healthy", lambda url, timeout=3.0: False)
    watch = ServerWatch(["http://127.0.0.1:1/v1"], local=Local(), max_restarts=1)
    watch.after_restart.append(reload)
    asyncio.run(watch.check())
    assert events == ["restart", "reload the trained weights"] and watch.restarts == 1
    with pytest.raises(ServerLost):  # the limit holds; no hook runs without a restart
        asyncio.run(watch.check())
    assert events == ["restart", "reload the trained weights"]
