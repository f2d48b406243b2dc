"""math-verify in worker processes with a hard timeout (as verifiers' MathRubric does).

math-verify can take seconds, or hang, on a short hostile answer (its parser and sympy), and its
own timeout works only in a process's main thread. So a run never calls it on the event loop or
in a thread: `Verifier.matches` sends (answer, reference) to one of `workers` processes (started
on first use, each with an address-space limit) and awaits the reply; past `timeout_s` the worker
is killed and replaced, the answer counts as not verified, and the timeout is counted. Results are
cached per (answer, reference), never a timeout. The parser only reaches sympy's `parse_expr`
with digits and operators (math-verify's own pattern), and answers are cut at `max_chars` first.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import resource
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger(__name__)


def _serve(conn: Connection, memory_mb: int, timeout_s: int) -> None:
    """A worker: (answer, reference) in, a bool out, until the pipe closes. math-verify's own
    timeouts are a backstop at 3x the hard one: a check that runs long is cut by the caller (killed,
    counted, not cached) rather than answered False by math-verify (which could be cached)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    from math_verify import parse, verify

    conn.send("ready")  # imports take a second or two: not part of any check's time
    while True:
        try:
            predicted, reference = conn.recv()
        except EOFError:
            return
        try:
            gold = parse(f"${reference}$", parsing_timeout=3 * timeout_s)
            guess = parse(f"${predicted}$", parsing_timeout=3 * timeout_s)
            ok = bool(gold and guess and verify(gold, guess, timeout_seconds=3 * timeout_s))
        except Exception:  # the verifier raises a variety of errors on hostile input: not verified
            ok = False
        conn.send(ok)


class _Worker:
    def __init__(self, memory_mb: int, timeout_s: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_mb, timeout_s), daemon=True, name="opd-math-verify")
        self.process.start()
        child.close()
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError("a math-verify worker did not start")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class Verifier:
    """Answer checking for one run; `close()` stops the workers."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 2048, cache_size: int = 8192) -> None:
        self.size, self.timeout_s, self.memory_mb, self.cache_size = workers, timeout_s, memory_mb, cache_size
        self._idle: list[_Worker] = []
        self._started = 0
        self._available: asyncio.Condition | None = None
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        # Answers whose check ran past `timeout_s` (counted, never cached).
        self.timeouts = 0

    async def matches(self, predicted: str, reference: str) -> bool | None:
        """True or False; None when the check timed out (counts as not verified)."""
        key = (predicted, reference)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        worker = await self._take()
        try:
            ok = await asyncio.wait_for(self._ask(worker, key), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            self.timeouts += 1
            logger.warning("math-verify timed out after %.0f s on %r (counted in math_verify/timeouts; its worker was replaced)", self.timeout_s, predicted[:80])
            await asyncio.to_thread(worker.kill)
            self._started -= 1
            worker = None
            return None
        except (EOFError, OSError) as err:  # the worker died (e.g. at its memory limit): not verified
            logger.warning("math-verify's worker died on %r (%s); it was replaced", predicted[:80], type(err).__name__)
            await asyncio.to_thread(worker.kill)
            self._started -= 1
            worker = None
            return False
        except BaseException:
            await asyncio.to_thread(worker.kill)
            self._started -= 1
            worker = None
            raise
        finally:
            if worker is not None:
                self._idle.append(worker)
            await self._notify()
        self._cache[key] = ok
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return ok

    async def _take(self) -> _Worker:
        if self._available is None:
            self._available = asyncio.Condition()
        async with self._available:
            while not self._idle and self._started >= self.size:
                await self._available.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
        try:
            return await asyncio.to_thread(_Worker, self.memory_mb, max(1, round(self.timeout_s)))
        except BaseException:
            self._started -= 1
            raise

    async def _notify(self) -> None:
        if self._available is not None:
            async with self._available:
                self._available.notify()

    async def _ask(self, worker: _Worker, key: tuple[str, str]) -> bool:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Any] = loop.create_future()
        fd = worker.conn.fileno()
        loop.add_reader(fd, lambda: answered.done() or answered.set_result(None))
        try:
            worker.conn.send(key)
            await answered
            return bool(worker.conn.recv())
        finally:
            loop.remove_reader(fd)

    def close(self) -> None:
        for worker in self._idle:
            worker.kill()
        self._idle.clear()
        self._started = 0
