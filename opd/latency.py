"""Where a rollout's time goes: named phases timed into the ledger of the group or rollout running
them (the overhead bench's latency breakdown).

A run that asks for it (the runner's `latency` argument) gives each group a `Ledger`, current in
the group's task through a context variable, which asyncio copies into the tasks the group
starts; the environment opens a child ledger per rollout (`rollout()`), and the code on a
rollout's path times its steps into whichever ledger is current (`with phase("request"):`). A
phase opened inside another one is kept as `outer/inner` and is part of the outer's time. With
no ledger current, in every run that does not ask, a phase costs one context-variable lookup.

`breakdown` turns the written groups' ledgers into milliseconds per rollout: each rollout's own
phases, the group's phases (every rollout of a group waits for them), the wait for the rest of
its group, and `other`, the rest of its latency (event-loop turns, the env's own Python).
"""

from __future__ import annotations

import contextvars
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")

# What each phase is, in the order the breakdown lists them.
PHASES = {
    "prompt": "rendering and tokenising the prompt (and a tool response's continuation)",
    "slot": "waiting for a free request slot of a server",
    "request": "the HTTP request to the server, its answer decoded",
    "backoff": "waiting before a failed request is tried again",
    "parse": "decoding the sampled ids and reading the tool calls",
    "parser_load": "waiting for the turn parser to finish loading",
    "tool": "running tool calls",
    "reward": "scoring the rollouts (the verifier's round trips included)",
    "opd": "the OPD stage: judge votes and teacher scoring",
    "group_wait": "a finished rollout waiting for the rest of its group",
    "transfer": "with environment workers: the item to a worker and its group back (Ray)",
    "queued": "a finished group waiting for the runner to take it",
    "check": "the record check",
    "sinks": "the writer and the other sinks",
}


@dataclass
class Ledger:
    """Seconds per phase for one group or one rollout, and when it started and ended
    (`time.perf_counter`)."""

    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    rollouts: list["Ledger"] = field(default_factory=list)

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds


_ledger: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("opd_latency_ledger", default=None)
_open: contextvars.ContextVar[str | None] = contextvars.ContextVar("opd_latency_phase", default=None)


class phase:
    """`with phase("request"):` adds the block's wall time to the current ledger (none: nothing)."""

    __slots__ = ("name", "ledger", "started", "token")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.ledger = _ledger.get()
        if self.ledger is not None:
            outer = _open.get()
            if outer is not None:
                self.name = f"{outer}/{self.name}"
            self.token = _open.set(self.name)
            self.started = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        if self.ledger is not None:
            self.ledger.add(self.name, time.perf_counter() - self.started)
            _open.reset(self.token)


class rollout:
    """`with rollout():` around one rollout of a group: its phases go to a ledger of its own,
    a child of the group's (nothing when the group has none)."""

    __slots__ = ("child", "token")

    def __enter__(self) -> None:
        group = _ledger.get()
        self.child = None if group is None else Ledger()
        if self.child is not None and group is not None:
            group.rollouts.append(self.child)
            self.token = _ledger.set(self.child)

    def __exit__(self, *exc: Any) -> None:
        if self.child is not None:
            self.child.ended = time.perf_counter()
            _ledger.reset(self.token)


async def within(ledger: Ledger, work: Awaitable[T]) -> T:
    """Await `work` with `ledger` current (call it as a task of its own: the ledger stays in that
    task's context); `ledger.ended` is set when the work returns (the group is collected)."""
    _ledger.set(ledger)
    try:
        return await work
    finally:
        ledger.ended = time.perf_counter()


def export(ledger: Ledger) -> dict[str, Any]:
    """`ledger` as plain data for another process: its phases, its wall time and each rollout's
    phases and end (seconds after the ledger's start: clocks differ between nodes)."""
    start = ledger.started
    return {"phases": dict(ledger.phases), "wall": (ledger.ended or start) - start,
            "rollouts": [(dict(r.phases), (r.ended or start) - start) for r in ledger.rollouts]}


def absorb(ledger: Ledger, remote: dict[str, Any], received: float) -> None:
    """Add what another process timed for the same group (`export`, e.g. an environment worker's)
    to `ledger`, as if it ended when its group was `received` here: its phases, its rollouts, and
    the rest of the wait here as `transfer`."""
    started = received - remote["wall"]
    for name, seconds in remote["phases"].items():
        ledger.add(name, seconds)
    ledger.rollouts.extend(Ledger(started=started, ended=started + end, phases=dict(phases)) for phases, end in remote["rollouts"])
    ledger.add("transfer", max(0.0, started - ledger.started))


def current() -> Ledger | None:
    """The ledger phases now go to (None: no breakdown asked for)."""
    return _ledger.get()


def rollout_phases(group: Ledger, finished: float) -> list[dict[str, float]]:
    """Seconds per phase for each rollout of `group`, written at `finished`: the rollout's own
    phases, the group's, `group_wait` (from the rollout's end to its group's), `total` (from the
    group's start to `finished`) and `other` (what no top-level phase covers)."""
    rollouts = group.rollouts or [Ledger(started=group.started, ended=group.started)]
    collected = max(r.ended or group.started for r in rollouts)
    out = []
    for r in rollouts:
        phases = dict(r.phases)
        for name, seconds in group.phases.items():
            phases[name] = phases.get(name, 0.0) + seconds
        phases["group_wait"] = collected - (r.ended or collected)
        total = finished - group.started
        phases["other"] = total - sum(s for name, s in phases.items() if "/" not in name)
        phases["total"] = total
        out.append(phases)
    return out


def breakdown(groups: list[tuple[Ledger, float]]) -> dict[str, float]:
    """The mean milliseconds per rollout of every phase over `(group ledger, written at)` pairs,
    in `PHASES` order, then `other` and `total`; phases nobody spent time in are left out."""
    rows = [row for group, finished in groups for row in rollout_phases(group, finished)]
    if not rows:
        return {}
    names = {name for row in rows for name in row}
    order = [n for n in PHASES if n in names]
    order += sorted(n for n in names if n not in PHASES and n not in ("other", "total"))
    return {name: 1000 * statistics.fmean(row.get(name, 0.0) for row in rows) for name in [*order, "other", "total"]}
