"""The inline_math tools as the plain loop answers them, in process and without running model code:
the project's calculator, and `python_interpreter` for the programs the fixture writes (`print` of
arithmetic, `sum`, `range`, `len`, `str` and comprehensions), evaluated by walking their syntax tree
under the calculator's bounds. Anything else is answered with an error, never run."""

from __future__ import annotations

import ast
import json
from typing import Any

from opd.tools.calculator import CalculatorError, CalculatorLimits, evaluate

# Longest program read, in characters.
MAX_CODE_CHARS = 2000
# Longest `range` iterated.
MAX_RANGE = 100_000
# Largest magnitude of any value (the calculator's).
MAX_MAGNITUDE = CalculatorLimits().max_magnitude
# Largest exponent (the calculator's).
MAX_EXPONENT = CalculatorLimits().max_exponent


class Unsupported(ValueError):
    """The program uses something this evaluator does not run."""


def _check(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_MAGNITUDE:
        raise OverflowError("result too large")
    return value


class _Program:
    """Evaluates a program's expressions over a few names a comprehension binds."""

    _BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
               ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}

    _COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}

    def __init__(self) -> None:
        self.names: dict[str, Any] = {}

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.Pow):
                if not isinstance(right, (int, float)) or abs(right) > MAX_EXPONENT:
                    raise OverflowError("exponent too large")
                return _check(left**right)
            if type(node.op) not in self._BINARY:
                raise Unsupported(type(node.op).__name__)
            if isinstance(node.op, ast.Mult) and (isinstance(left, str) or isinstance(right, str)):
                raise Unsupported("string repetition")
            return _check(self._BINARY[type(node.op)](left, right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in self._COMPARE:
            return self._COMPARE[type(node.ops[0])](self.value(node.left), self.value(node.comparators[0]))
        if isinstance(node, (ast.Tuple, ast.List)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.Name):
            if node.id not in self.names:
                raise NameError(f"name '{node.id}' is not defined")
            return self.names[node.id]
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            return self._comprehension(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return self._call(node.func.id, [self.value(a) for a in node.args])
        raise Unsupported(type(node).__name__)

    def _comprehension(self, node: ast.GeneratorExp | ast.ListComp) -> list[Any]:
        if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name):
            raise Unsupported("nested comprehension")
        loop = node.generators[0]
        out = []
        for item in self.value(loop.iter):
            self.names[loop.target.id] = item
            if all(self.value(cond) for cond in loop.ifs):
                out.append(self.value(node.elt))
        return out

    def _call(self, name: str, args: list[Any]) -> Any:
        if name == "range":
            span = range(*args)
            if len(span) > MAX_RANGE:
                raise Unsupported("range too long")
            return list(span)
        if name == "str":
            (arg,) = args
            return str(arg)
        if name in ("sum", "len", "abs", "min", "max", "int"):
            return _check({"sum": sum, "len": len, "abs": abs, "min": min, "max": max, "int": int}[name](*args))
        raise Unsupported(f"function {name}")


def run_python(code: str) -> dict[str, Any]:
    """The `python_interpreter` result for `code`: its `print`s' output, or an error."""
    try:
        if len(code) > MAX_CODE_CHARS:
            raise Unsupported("program too long")
        tree = ast.parse(code)
        program, out = _Program(), []
        for statement in tree.body:
            call = statement.value if isinstance(statement, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print" and not call.keywords):
                raise Unsupported("a statement other than print(...)")
            out.append(" ".join(str(program.value(arg)) for arg in call.args) + "\n")
        return {"stdout": "".join(out), "stderr": "", "exit_code": 0}
    except (Unsupported, SyntaxError, ArithmeticError, TypeError, ValueError, NameError, RecursionError) as err:
        return {"stdout": "", "stderr": f"{type(err).__name__}: {err}", "exit_code": 1}


def answer_call(body: str) -> dict[str, Any]:
    """What the tool response holds for one call's JSON body (between the call markers)."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return {"error": f"tool call is not valid JSON: {err.msg} (a hermes tool call)"}
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return {"error": "a tool call is a JSON object with a name and an arguments object"}
    name, arguments = call.get("name"), call["arguments"]
    if name == "calculator" and isinstance(arguments.get("expr"), str):
        try:
            return {"value": evaluate(arguments["expr"])}
        except CalculatorError as err:
            return {"error": str(err)}
    if name == "python_interpreter" and isinstance(arguments.get("code"), str):
        return run_python(arguments["code"])
    return {"error": f"no tool {name!r} with these arguments"}
