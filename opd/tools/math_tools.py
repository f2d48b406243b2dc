"""inline_math's tools: `calculator` (an AST-walking evaluator, no `eval`) and `python_interpreter`
(a sandboxed subprocess), run against a `MathTools` context bound in a `Toolbox`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opd.config import SandboxConfig
from opd.tools.calculator import CalculatorError, CalculatorLimits, evaluate
from opd.registry import Registry
from opd.tools.registry import Tool, ToolError, toolset
from opd.jail.sandbox import run_python


@dataclass(frozen=True)
class MathTools:
    """What the math tools of one run need: the calculator's bounds and the sandbox limits."""

    calculator: CalculatorLimits
    sandbox: SandboxConfig


async def _calculator(ctx: MathTools, args: dict[str, str]) -> dict[str, Any]:
    try:
        return {"value": evaluate(args["expr"], ctx.calculator)}
    except CalculatorError as err:
        raise ToolError(str(err)) from None


async def _python(ctx: MathTools, args: dict[str, str]) -> dict[str, Any]:
    result = await run_python(args["code"], ctx.sandbox)
    if result.error is not None:
        raise ToolError(result.error, content=result.as_tool_result())
    return result.as_tool_result()


# Names and descriptions are what the model reads (the fixture model was trained on them).
TOOLS: Registry[Tool] = toolset([
    Tool("calculator", "Evaluate an arithmetic expression and return its value.", (("expr", "Arithmetic, e.g. (2 + 3) * 4"),), _calculator),
    Tool("python_interpreter", "Run a short Python program; returns stdout, stderr and the value of a final expression.", (("code", "Python source code"),), _python),
])
