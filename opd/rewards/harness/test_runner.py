"""Runs in the tests' jail: runs the task's tests against a stand-in `solution` module whose
functions ask the solution's process (another jail) to run the real ones, and writes the verdict
to a descriptor only this process holds.

Usage: test_runner.py REQUESTS_FD ANSWERS_FD VERDICT_FD TESTS_FILE

The verdict is one JSON object: {"level": "pass" | "assertion" | "crash", "detail": "..."}:
pass when the tests ran to the end, assertion when one of their assertions failed, crash for
anything else (the solution did not import, raised, returned something that is not data, or its
process ended). The solution never runs in this process, so nothing it does can make a test pass.

The stand-in module never holds a dunder name, and `from solution import *` binds only the
solution's public names that are neither builtins nor names the tests bind themselves: a solution
cannot replace `abs`, `__name__`, a helper or an import of the tests in their namespace.
"""

import ast
import builtins
import json
import keyword
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


def bound_names(tree: ast.Module) -> set[str]:
    """The names the tests' module level binds (definitions, imports, assignments), not counting
    those bound only inside their functions or classes."""
    names = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Lambda):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return names


def settable(name: object) -> bool:
    """A name the stand-in module may hold: an identifier, not a keyword, not a dunder."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and not (name.startswith("__") and name.endswith("__"))


def star_exportable(name: str, tests_bind: set[str]) -> bool:
    """May `from solution import *` bind `name` in the tests' namespace?"""
    return not name.startswith("_") and not hasattr(builtins, name) and name not in tests_bind


def solution_module(link, tests_bind: set[str]) -> types.ModuleType:
    """The stand-in `solution` module; its `__all__` is what a star import may bind."""
    reply = link.ask({"op": "names"})
    if "import_error" in reply:
        raise SolutionError(f"solution.py does not import: {reply['import_error']}")
    declared = reply.get("all")
    # Without __all__, a star import takes the public names, as in Python.
    star = {n for n in declared if isinstance(n, str)} if isinstance(declared, list) else None
    module = types.ModuleType("solution")
    exported = []
    for name, entry in dict(reply.get("names", {})).items():
        if not settable(name) or not isinstance(entry, dict):
            continue
        exportable = (star is None or name in star) and star_exportable(name, tests_bind)
        if entry.get("callable"):
            value = stand_in(link, name)
        elif "module" in entry:
            # A module the solution imported reaches the tests only through a star import.
            value = library_module(entry["module"]) if exportable else None
            if value is None:
                continue
        else:
            value = wire.decode(entry.get("value"))
        setattr(module, name, value)
        if exportable:
            exported.append(name)
    module.__all__ = exported
    return module


def library_module(name: object) -> types.ModuleType | None:
    """The installed module `name` (none of this jail's own files), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    if not isinstance(name, str) or os.path.exists(os.path.join(here, name.split(".")[0] + ".py")):
        return None
    try:
        return __import__(name)
    except ImportError:
        return None


def main():
    requests_fd, answers_fd, verdict_fd, tests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    verdict = os.fdopen(verdict_fd, "w", encoding="utf-8")
    link = Link(requests_fd, answers_fd)
    level, detail = "pass", ""
    try:
        with open(tests, encoding="utf-8") as handle:
            tree = compile(handle.read(), "tests.py", "exec", ast.PyCF_ONLY_AST)
        try:
            sys.modules["solution"] = solution_module(link, bound_names(tree))
        except SystemExit as err:  # a library module the solution named exited on import: not the tests' doing
            raise RuntimeError(f"importing the solution's names exited with {err.code!r}") from None
        exec(compile(tree, "tests.py", "exec"), {"__name__": "__main__"})
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
