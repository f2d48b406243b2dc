"""Runs in the tests' jail: runs the task's tests against a stand-in `solution` module whose
functions ask the solution's process (another jail) to run the real ones, and writes the verdict
to a descriptor only this process holds.

Usage: test_runner.py REQUESTS_FD ANSWERS_FD VERDICT_FD TESTS_FILE

The verdict is one JSON object: {"level": "pass" | "assertion" | "crash", "detail": "..."}:
pass when the tests ran to the end, assertion when one of their assertions failed, crash for
anything else (the solution did not import, raised, returned something that is not data, or its
process ended). The solution never runs in this process, so nothing it does can make a test pass.
"""

import builtins
import json
import os
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I keeps the script's folder off the path
import wire  # noqa: E402


class SolutionError(BaseException):
    """The solution's process ended or broke the protocol, or raised something no built-in exception
    stands for. Not an `Exception`: a test's `except Exception` must not turn it into a pass."""


class Link:
    def __init__(self, requests_fd, answers_fd):
        self.requests = os.fdopen(requests_fd, "w", encoding="utf-8")
        self.answers = os.fdopen(answers_fd, "r", encoding="utf-8")

    def ask(self, message):
        try:
            self.requests.write(wire.dumps(message))
            self.requests.flush()
        except BrokenPipeError:
            raise SolutionError("the solution's process has ended") from None
        line = self.answers.readline(wire.MAX_LINE + 1)
        if not line:
            raise SolutionError("the solution's process has ended")
        try:
            return wire.loads(line)
        except (ValueError, RecursionError) as err:
            raise SolutionError(f"the solution's process sent something unreadable: {err}") from None


def remote_exception(names, message):
    """The first built-in exception among the raised one's classes (tests may expect ValueError,
    also from a subclass the solution defined), else SolutionError."""
    for name in names if isinstance(names, list) else []:
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(message)
    return SolutionError(f"{names[0] if names else 'an exception'}: {message}")


def stand_in(link, name):
    def call(*args, **kwargs):
        reply = link.ask({"op": "call", "name": name, "args": wire.encode(list(args)), "kwargs": wire.encode(kwargs)})
        if "raised" in reply:
            raise remote_exception(reply.get("raised"), str(reply.get("message", "")))
        if "unsupported" in reply:
            raise TypeError(f"{name} returned something the tests cannot compare: {reply['unsupported']}")
        try:
            return wire.decode(reply["value"])
        except (KeyError, ValueError, TypeError, RecursionError) as err:
            raise SolutionError(f"{name}: unreadable result: {err}") from None

    call.__name__ = call.__qualname__ = name
    return call


def solution_module(link):
    reply = link.ask({"op": "names"})
    if "import_error" in reply:
        raise SolutionError(f"solution.py does not import: {reply['import_error']}")
    module = types.ModuleType("solution")
    exported = []
    for name, entry in dict(reply.get("names", {})).items():
        if not isinstance(name, str) or not isinstance(entry, dict):
            continue
        if entry.get("callable"):
            value = stand_in(link, name)
        elif "module" in entry:
            try:
                value = __import__(str(entry["module"]))
            except ImportError:
                continue
        else:
            value = wire.decode(entry.get("value"))
        setattr(module, name, value)
        exported.append(name)
    module.__all__ = exported
    return module


def main():
    requests_fd, answers_fd, verdict_fd, tests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    verdict = os.fdopen(verdict_fd, "w", encoding="utf-8")
    link = Link(requests_fd, answers_fd)
    level, detail = "pass", ""
    try:
        sys.modules["solution"] = solution_module(link)
        with open(tests, encoding="utf-8") as handle:
            code = compile(handle.read(), "tests.py", "exec")
        exec(code, {"__name__": "__main__"})
    except AssertionError:
        level, detail = "assertion", traceback.format_exc(limit=-3)
    except SystemExit as err:
        if err.code not in (0, None):
            level, detail = "crash", f"the tests exited with {err.code!r}"
    except BaseException:  # noqa: BLE001 - any other way the tests did not finish is a crash
        level, detail = "crash", traceback.format_exc(limit=-3)
    verdict.write(json.dumps({"level": level, "detail": detail[-2000:]}))
    verdict.close()


if __name__ == "__main__":
    main()
