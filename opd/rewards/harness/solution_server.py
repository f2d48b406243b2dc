"""Runs in the solution's jail: imports `solution` and answers the tests' requests, one JSON line
each, on the two descriptors given as arguments (requests in, answers out).

    {"op": "names"}                       -> {"names": {name: {"callable": true} | {"value": v} | {"module": m}},
                                              "all": the module's __all__ or null} or {"import_error": "..."}
    {"op": "call", "name", "args", "kwargs"} -> {"value": v} | {"raised": [class names, most derived first],
                                                "message": str} | {"unsupported": why}

Nothing here decides a verdict: the tests run in another process, in another jail, and see only
the data this process sends. The solution can write to these descriptors itself; that only
changes what its own functions appear to return.
"""

import importlib
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I keeps the script's folder off the path
import wire  # noqa: E402


def public_names(module):
    """The module's names but dunders: every function and module (an explicit import may ask for
    any), data only where a star import would take it (`__all__`, else no leading underscore). The
    tests' side decides what `from solution import *` binds."""
    declared = declared_names(module)
    out = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            out[name] = {"module": value.__name__}
        elif callable(value):
            out[name] = {"callable": True}
        elif name in declared if declared is not None else not name.startswith("_"):
            try:
                out[name] = {"value": wire.encode(value)}
            except wire.Unsupported:
                continue
    return out


def declared_names(module):
    """The strings of the module's `__all__`, or None when it has none."""
    declared = getattr(module, "__all__", None)
    return [n for n in declared if isinstance(n, str)] if isinstance(declared, (list, tuple)) else None


def answer(module, message):
    if message.get("op") == "call":
        function = getattr(module, str(message.get("name")), None)
        if not callable(function):
            return {"raised": ["AttributeError"], "message": f"solution has no function {message.get('name')!r}"}
        try:
            result = function(*wire.decode(message["args"]), **wire.decode(message["kwargs"]))
        except BaseException as err:  # the solution's own exceptions go to the tests
            return {"raised": [cls.__name__ for cls in type(err).__mro__], "message": str(err)[:2000]}
        try:
            return {"value": wire.encode(result)}
        except wire.Unsupported as err:
            return {"unsupported": str(err)}
    return {"raised": ["ValueError"], "message": "unknown request"}


def main():
    requests = os.fdopen(int(sys.argv[1]), "r", encoding="utf-8")
    answers = os.fdopen(int(sys.argv[2]), "w", encoding="utf-8")
    sys.path.insert(0, os.getcwd())  # solution.py (-I keeps the working directory off the path)
    module = None
    for line in requests:
        message = wire.loads(line)
        if message.get("op") == "names":
            try:
                module = importlib.import_module("solution")
                reply = {"names": public_names(module), "all": declared_names(module)}
            except BaseException as err:
                reply = {"import_error": f"{type(err).__name__}: {str(err)[:2000]}"}
        elif module is None:
            reply = {"raised": ["ImportError"], "message": "solution was not imported"}
        else:
            reply = answer(module, message)
        answers.write(wire.dumps(reply))
        answers.flush()


if __name__ == "__main__":
    main()
