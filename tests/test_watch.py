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


def test_a_dead_teacher_server_is_restarted_by_its_own_watch_and_the_trainers_hooks_do_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.serving import watch as watch_module
    from opd.serving.watch import ServerLost, ServerWatch, Watches

    events: list[str] = []
    up = {"http://policy/v1": True, "http://teacher/v1": False}

    class Local:
        def __init__(self, url: str) -> None:
            self.url, self.log_path = url, f"{url}/server.log"

        def restart(self) -> str:
            events.append(f"restart {self.url}")
            up[self.url] = True
            return self.url

    async def reload() -> None:
        events.append("reload the trained weights")

    monkeypatch.setattr(watch_module, "healthy", lambda url, timeout=3.0: up[url])
    policy = ServerWatch(["http://policy/v1"], local=Local("http://policy/v1"), max_restarts=2)
    policy.after_restart.append(reload)
    teacher = ServerWatch(["http://teacher/v1"], local=Local("http://teacher/v1"), max_restarts=1, name="teacher",
                          restarts_key="teacher.server.max_restarts")
    checks = Watches(policy, teacher, None)
    asyncio.run(checks.check())
    # The teacher came back with the weights it was started with: no trainer hook runs for it.
    assert events == ["restart http://teacher/v1"] and (teacher.restarts, policy.restarts, policy.outages) == (1, 0, 0)
    up["http://teacher/v1"] = False
    with pytest.raises(ServerLost, match=r"the teacher's embedded vLLM server at http://teacher/v1 died again after 1 restart\(s\) "
                                         r"\(teacher.server.max_restarts=1\)"):
        asyncio.run(checks.check())
    # Both down: the policy first (and its hooks), then the teacher.
    up.update({"http://policy/v1": False, "http://teacher/v1": False})
    teacher.restarts = 0
    asyncio.run(checks.check())
    assert events[1:] == ["restart http://policy/v1", "reload the trained weights", "restart http://teacher/v1"]


def test_the_teachers_watch_restarts_its_own_local_server_waits_for_a_running_one_and_leaves_a_shared_one_to_the_policy(tmp_path) -> None:
    from conftest import compose
    from opd.build import resolve_model
    from opd.serving.lifecycle import TeacherServer
    from opd.config import validate

    student, teacher = resolve_model("fixture"), resolve_model("fixture_teacher")

    def watch(overrides: list[str], model: str):
        cfg = validate(compose(["teacher=model", f"teacher.server.model={model}", *overrides]))
        server = TeacherServer(cfg, student, resolve_model(model), tmp_path)  # built, never started
        try:
            return server.watch()
        finally:
            server.__exit__(None, None, None)  # a local server's scratch directory goes

    local = watch(["teacher.server.max_restarts=3"], "fixture_teacher")
    assert local.local is not None and local.urls == [local.local.base_url] and local.local.model == teacher
    assert (local.max_restarts, local.restarts_key, local.name) == (3, "teacher.server.max_restarts", "teacher") and local.after_restart == []
    running = watch(["teacher.server.base_url=http://teacher-host:8001/v1", "server.unreachable_timeout_s=7"], "fixture_teacher")
    assert running.local is None and running.urls == ["http://teacher-host:8001/v1"] and running.unreachable_timeout_s == 7
    assert watch([], "fixture") is None  # the policy's own model on the policy's server: the policy's watch covers it
    # With trainer=local refreshing the policy's weights, the same model gets a fixed server of its own, and a watch.
    assert watch(["trainer=local"], "fixture").local is not None
