"""Request slots: one pool per inference server, and waiting for a slot without polling.

atroposlib 0.4.0's `ServerManager` sends a request that finds every slot busy to sleep a whole
second before it looks again (`wait_for_sem` polls with `asyncio.sleep(1)`). That is harmless
while rollouts never outnumber the slots, and caps throughput once they do, which
`runner.groups_in_flight=null` does on purpose: at 100 ms per request an oversubscribed run got
half the throughput of one that was not (`python -m experiments.bench overhead`).

Here every request to a server (rollouts, judge votes, teacher scoring, evaluation) takes a slot
of that server's one `SlotSemaphore` (its train and eval pools are the same object, so no path
can exceed `server.max_requests_in_flight`) and queues FIFO on it; with several servers, a request
that finds them all full waits to be woken by the next release, then goes to the server with the
most free slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable

from atroposlib.envs.server_handling.server_baseline import AsyncSemWithAdaptiveWeight
from atroposlib.envs.server_handling.server_manager import ServerManager

logger = logging.getLogger(__name__)


class SlotSemaphore(AsyncSemWithAdaptiveWeight):
    """atroposlib's request semaphore that also tells listeners each time a slot is released."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.listeners: list[Callable[[], None]] = []

    def release(self) -> None:
        super().release()
        for listener in self.listeners:
            listener()


class SlotServerManager(ServerManager):
    """`ServerManager` whose requests wait for a free slot without polling (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: deque[asyncio.Future[None]] = deque()
        # Every server, whatever its class, gets one pool for all its requests, and tells this
        # manager when a slot frees (a waiter that is never told would wait forever).
        for server in self.servers:
            server.sem = server.eval_sem = SlotSemaphore(server.config.num_max_requests_at_once)
            server.sem.listeners.append(self._slot_freed)

    def _slot_freed(self) -> None:
        # Wake one waiter; it re-checks and, if another request took the slot first, waits again.
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def free_slots(self) -> list[int]:
        return [server.sem._value if server.server_healthy else 0 for server in self.servers]

    async def wait_for_sem(self, is_training: bool) -> None:
        """Return when some server has a free slot; with one server at once (its semaphore queues)."""
        if len(self.servers) < 2:
            return
        while max(self.free_slots()) <= 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._slot_freed()  # pass on a wake-up this cancelled request received
                raise
