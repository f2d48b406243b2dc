"""math-verify in worker processes with a hard timeout (as verifiers' MathRubric does).

math-verify can take seconds, or hang, on a short hostile answer (its parser and sympy), and its
own timeout works only in a process's main thread. So a run never calls it on the event loop or
in a thread: `Verifier.matches` sends (answer, reference) to one of `workers` processes
(`opd.rewards.verify_worker`, each with an address-space limit; started ahead by `start()`, else
on first use) and awaits the reply; rollouts that ask about the same (answer, reference) at once
share one check. Past `timeout_s` the worker is killed and replaced, the answer counts as not
verified, and the timeout is counted. Results are cached per (answer, reference), never a timeout. The parser only reaches sympy's `parse_expr`
with digits and operators (math-verify's own pattern), and answers are cut at `max_chars` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import select
import subprocess
import sys
from collections import OrderedDict
from typing import Any

from opd.latency import phase

logger = logging.getLogger(__name__)

# How long a new worker may take to import math-verify and say it is ready.
READY_TIMEOUT_S = 120.0


def worker_command(memory_mb: int, timeout_s: int) -> list[str]:
    return [sys.executable, "-m", "opd.rewards.verify_worker", str(memory_mb), str(timeout_s)]


class _Worker:
    """One `opd.rewards.verify_worker` process, started by vfork (no fork of the launcher, no
    multiprocessing machinery, so it works in any process: joblib's workers too)."""

    def __init__(self, memory_mb: int, timeout_s: int) -> None:
        self.process = subprocess.Popen(worker_command(memory_mb, timeout_s),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.reader, self.writer = self.process.stdout, self.process.stdin
        started, _, _ = select.select([self.reader], [], [], READY_TIMEOUT_S)
        ready = self.reader.readline() if started else ""
        if ready.strip() != "ready":
            self.kill()
            raise RuntimeError("a math-verify worker did not start" + ("" if started else f" within {READY_TIMEOUT_S:g} s"))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                stream.close()


class Verifier:
    """Answer checking for one run; `start()` starts the workers ahead, `close()` stops them."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 2048, cache_size: int = 8192) -> None:
        self.size, self.timeout_s, self.memory_mb, self.cache_size = workers, timeout_s, memory_mb, cache_size
        self._idle: list[_Worker] = []
        self._started = 0
        # Every worker process alive, idle or busy (close() kills them all).
        self._workers: set[_Worker] = set()
        self._available: asyncio.Condition | None = None
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        # Checks in progress by (answer, reference): a second rollout with the same answer waits for it.
        self._checking: dict[tuple[str, str], asyncio.Task[bool | None]] = {}
        # Answers whose check ran past `timeout_s` (counted, never cached).
        self.timeouts = 0

    async def start(self) -> None:
        """Start the workers not started yet, all at once, so that no check waits for a start
        (a worker's start is a second or more of imports); raises the first start that failed."""
        missing = self.size - self._started
        if missing <= 0:
            return
        self._started += missing
        started = await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(missing)), return_exceptions=True)
        self._started -= sum(isinstance(worker, BaseException) for worker in started)
        self._idle.extend(worker for worker in started if isinstance(worker, _Worker))
        await self._notify(every=True)
        for failed in started:
            if isinstance(failed, BaseException):
                raise failed

    async def matches(self, predicted: str, reference: str) -> bool | None:
        """True or False; None when the check timed out (counts as not verified)."""
        key = (predicted, reference)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        with phase("verify"):
            checking = self._checking.get(key)
            if checking is None:
                checking = self._checking[key] = asyncio.ensure_future(self._check(key))
                checking.add_done_callback(functools.partial(self._checked, key))
            # Shielded: a group that is cancelled does not cancel a check another group waits for.
            return await asyncio.shield(checking)

    def _checked(self, key: tuple[str, str], checking: asyncio.Task[bool | None]) -> None:
        self._checking.pop(key, None)
        if not checking.cancelled():
            checking.exception()  # retrieved: it reached every caller still waiting

    async def _check(self, key: tuple[str, str]) -> bool | None:
        predicted = key[0]
        worker = await self._take()
        try:
            ok = await asyncio.wait_for(self._ask(worker, key), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            self.timeouts += 1
            logger.warning("math-verify timed out after %.0f s on %r (counted in math_verify/timeouts; its worker was replaced)", self.timeout_s, predicted[:80])
            await self._discard(worker)
            worker = None
            return None
        except (EOFError, OSError) as err:  # the worker died (e.g. at its memory limit): not verified
            logger.warning("math-verify's worker died on %r (%s); it was replaced", predicted[:80], type(err).__name__)
            await self._discard(worker)
            worker = None
            return False
        except BaseException:
            await self._discard(worker)
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
            with phase("worker_start"):
                return await asyncio.to_thread(self._spawn)
        except BaseException:
            self._started -= 1
            raise

    def _spawn(self) -> _Worker:
        worker = _Worker(self.memory_mb, max(1, round(self.timeout_s)))
        self._workers.add(worker)
        return worker

    async def _discard(self, worker: _Worker) -> None:
        if worker in self._workers:  # not yet killed by close()
            self._workers.discard(worker)
            self._started -= 1
        await asyncio.to_thread(worker.kill)

    async def _notify(self, every: bool = False) -> None:
        if self._available is not None:
            async with self._available:
                if every:
                    self._available.notify_all()
                else:
                    self._available.notify()

    async def _ask(self, worker: _Worker, key: tuple[str, str]) -> bool:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Any] = loop.create_future()
        fd = worker.reader.fileno()
        loop.add_reader(fd, lambda: answered.done() or answered.set_result(None))
        try:
            worker.writer.write(json.dumps(list(key)) + "\n")
            worker.writer.flush()
            await answered
            line = worker.reader.readline()  # a whole line: the worker writes one per answer
        finally:
            loop.remove_reader(fd)
        if not line:
            raise EOFError("the math-verify worker ended")
        return line.strip() == "true"

    def close(self) -> None:
        """Stop every worker, busy ones too (a check still waiting on one ends as not verified)."""
        for checking in list(self._checking.values()):
            checking.cancel()
        for worker in list(self._workers):
            worker.kill()
        self._workers.clear()
        self._idle.clear()
        self._started = 0
