"""The inline_math tools as the plain loop answers them, in process and without running model code:
the project's calculator, and `python_interpreter` for the programs the fixture writes (`print` of
arithmetic, `sum`, `range`, `len`, `str` and comprehensions), evaluated by walking their syntax tree
under the calculator's bounds and a budget of steps. Anything else is answered with an error, never
run; whatever the program, the answer is a result or an error, in bounded time and memory."""

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
# Most steps of work one program may take: a step is one syntax node evaluated, or one element (a
# string's character) of a sequence built, copied, compared, summed or printed. A comprehension over
# `range(100000)` with a body of up to ~18 nodes fits; spending it all takes under 1 s of CPU here;
# the fixture's programs take under 100.
MAX_STEPS = 2_000_000
# Longest stdout answered, in characters (the sandbox's `output_chars`); the rest is cut, saying so.
MAX_OUTPUT_CHARS = 2000
# Steps a float or complex costs where its text is made (str, print): up to ~50 characters, ~3 us
# each; an int pays about its digits (up to ~104 below the magnitude bound).
NUMBER_STEPS = 24


class Unsupported(ValueError):
    """The program uses something this evaluator does not run."""


def _check(value: Any) -> Any:
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool) and not abs(value) <= MAX_MAGNITUDE:
        raise OverflowError("result too large" if abs(value) == abs(value) else "result is not a number")
    return value


class _Program:
    """Evaluates a program's expressions over the names its comprehensions bind, counting its steps."""

    _BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
               ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}

    _COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}

    def __init__(self, max_steps: int) -> None:
        self.names: dict[str, Any] = {}
        self.steps_left = max_steps
        self.max_steps = max_steps

    def spend(self, steps: int) -> None:
        """Take `steps` from the budget, before the work they pay for."""
        self.steps_left -= steps
        if self.steps_left < 0:
            raise Unsupported(f"the program takes more than {self.max_steps} steps")

    def spend_walk(self, *values: Any, text: bool = False) -> None:
        """Pay for walking `values` whole (str, print, compare, min, max): their elements, nested
        ones included, counted until the budget is out (a list can hold one list many times); with
        `text` (str, print), each number its text too."""
        stack = list(values)
        self.spend(len(stack))
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                self.spend(len(value))
            elif text and isinstance(value, int):
                self.spend(value.bit_length() // 3 + 2)
            elif text and isinstance(value, (float, complex)):
                self.spend(NUMBER_STEPS)
            elif isinstance(value, (list, tuple, range)):
                self.spend(len(value))
                if not isinstance(value, range):
                    stack.extend(value)

    def value(self, node: ast.AST) -> Any:
        self.steps_left -= 1  # spend(1), inline: this runs once per node evaluated
        if self.steps_left < 0:
            self.spend(0)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
            return node.value  # checked once, by run_python
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            return self.operate(node.op, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in self._COMPARE:
            left, right = self.value(node.left), self.value(node.comparators[0])
            if isinstance(left, _SEQUENCES) or isinstance(right, _SEQUENCES):
                self.spend_walk(left, right)
            return self._COMPARE[type(node.ops[0])](left, right)
        if isinstance(node, ast.Tuple):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.List):
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

    def operate(self, op: ast.operator, left: Any, right: Any) -> Any:
        """`left op right`, its cost paid before it runs."""
        if isinstance(op, ast.Pow):
            if not isinstance(right, (int, float)) or abs(right) > MAX_EXPONENT:
                raise OverflowError("exponent too large")
            return _check(left**right)
        if type(op) not in self._BINARY:
            raise Unsupported(type(op).__name__)
        left_sequence, right_sequence = isinstance(left, _SEQUENCES), isinstance(right, _SEQUENCES)
        if isinstance(op, ast.Mod) and isinstance(left, str):
            raise Unsupported("string formatting")
        if isinstance(op, ast.Mult) and left_sequence != right_sequence:
            sequence, times = (left, right) if left_sequence else (right, left)
            if isinstance(times, int):
                self.spend(len(sequence) * max(times, 0))
        elif isinstance(op, ast.Add) and left_sequence and right_sequence:
            self.spend(len(left) + len(right))
        return _check(self._BINARY[type(op)](left, right))

    def _comprehension(self, node: ast.GeneratorExp | ast.ListComp) -> list[Any]:
        if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name):
            raise Unsupported("nested comprehension")
        loop, name = node.generators[0], node.generators[0].target.id
        out, outer = [], self.names.get(name, _UNBOUND)
        try:
            for item in self.value(loop.iter):
                self.steps_left -= 1
                self.names[name] = item
                if all(self.value(cond) for cond in loop.ifs):
                    out.append(self.value(node.elt))
        finally:  # the loop's name is the comprehension's own, as in Python 3
            if outer is _UNBOUND:
                self.names.pop(name, None)
            else:
                self.names[name] = outer
        return out

    def _call(self, name: str, args: list[Any]) -> Any:
        if name == "range":
            span = range(*args)
            if len(span) > MAX_RANGE:
                raise Unsupported("range too long")
            return span
        self.spend_walk(*args, text=name == "str")
        if name == "sum" and len(args) == 2 and isinstance(args[1], (list, tuple)):
            total = args[1]
            for item in args[0]:  # each `+` paid as one: summing lists is quadratic
                total = self.operate(ast.Add(), total, item)
            return total
        if name == "str":
            (arg,) = args
            return str(arg)
        if name in ("sum", "len", "abs", "min", "max", "int"):
            return _check({"sum": sum, "len": len, "abs": abs, "min": min, "max": max, "int": int}[name](*args))
        raise Unsupported(f"function {name}")


_UNBOUND = object()
# What a step is paid for walking; `range` is not copied by `+` or `*` (Python refuses both).
_SEQUENCES = (str, list, tuple, range)


def run_python(code: str, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """The `python_interpreter` result for `code`: its `print`s' output, or an error."""
    try:
        if len(code) > MAX_CODE_CHARS:
            raise Unsupported("program too long")
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant):
                _check(node.value)
        program, out = _Program(max_steps), []
        for statement in tree.body:
            call = statement.value if isinstance(statement, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print" and not call.keywords):
                raise Unsupported("a statement other than print(...)")
            args = [program.value(arg) for arg in call.args]
            program.spend_walk(*args, text=True)
            out.append(" ".join(map(str, args)) + "\n")
        stdout = "".join(out)
        stdout.encode("utf-8")  # as Python's stdout would: a lone surrogate is an error, not text for the tokenizer
        if len(stdout) > MAX_OUTPUT_CHARS:
            stdout = stdout[:MAX_OUTPUT_CHARS] + f"\n...[truncated at {MAX_OUTPUT_CHARS} characters]"
        return {"stdout": stdout, "stderr": "", "exit_code": 0}
    except (Unsupported, SyntaxError, ArithmeticError, TypeError, ValueError, NameError, RecursionError) as err:
        return {"stdout": "", "stderr": f"{type(err).__name__}: {err}", "exit_code": 1}


def answer_call(body: str) -> dict[str, Any]:
    """What the tool response holds for one call's JSON body (between the call markers)."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return {"error": f"tool call is not valid JSON: {err.msg} (a hermes tool call)"}
    except (ValueError, RecursionError) as err:  # a number past int's digit limit; nesting past the recursion limit
        return {"error": f"tool call is not readable JSON: {type(err).__name__} (a hermes tool call)"}
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
    shown = repr(name[:100]) if isinstance(name, str) else type(name).__name__  # the model's name, not all of it
    return {"error": f"no tool {shown} with these arguments"}
