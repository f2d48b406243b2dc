"""opd_coding's reward: the task's tests and the signals (names match `reward.weights`).

- `correctness`: the configured credit for how the task's tests went (`correctness_levels`);
- `efficiency`: by assistant turns used; `tool_usage`: writing code and running it.
Each is a raw value in [0, 1]; the weights make the score.

Correctness comes from the task's own tests, run by the reward: only the agent's `solution.py`
is copied into a fresh directory next to the task's test file, so nothing else the agent wrote
(its own test files included) can affect the verdict. The test run must print a per-run random
marker after the last assertion, so a solution that exits early with status 0 does not pass.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opd.config import SandboxConfig
from opd.rewards.rubric import Signals
from opd.tools.registry import ToolError
from opd.tools.workspace import Workspace

SOLUTION = "solution.py"
TASK_TESTS = "_task_tests.py"


@dataclass(frozen=True)
class TestOutcome:
    """What running the task's tests against the solution gave."""

    level: str  # pass | assertion | crash | nothing_written
    output: str


async def run_task_tests(solution_dir: Path, test_code: str, limits: SandboxConfig) -> TestOutcome:
    solution = solution_dir / SOLUTION
    if not solution.is_file() or solution.is_symlink():
        return TestOutcome("nothing_written", "")
    marker = f"opd-tests-completed-{secrets.token_hex(8)}"
    workspace = Workspace(limits)
    try:
        try:
            workspace.write_file(SOLUTION, solution.read_text(encoding="utf-8", errors="replace"))
        except ToolError as err:
            return TestOutcome("crash", f"error: {err}")
        workspace.write_file(TASK_TESTS, f"{test_code}\nprint({marker!r})\n")
        output = await workspace.terminal(f"python {TASK_TESTS}")
    finally:
        workspace.close()
    if output.endswith("[exit code 0]") and marker in output:
        return TestOutcome("pass", output)
    if "AssertionError" in output:
        return TestOutcome("assertion", output)
    return TestOutcome("crash", output)


@dataclass(frozen=True)
class CodingOutcome:
    """What the signals need to know about one finished rollout."""

    tests: str  # pass | assertion | crash | nothing_written
    turns_used: int
    max_turns: int
    tools_used: tuple[str, ...]  # names of the calls that reached a tool


SIGNALS: Signals[CodingOutcome] = Signals()


@SIGNALS.add
def correctness(outcome: CodingOutcome, reward: Any) -> float:
    """The configured credit for the tests' outcome."""
    levels = reward.correctness_levels
    return {"pass": levels.passed, "assertion": levels.assertion, "crash": levels.crash, "nothing_written": levels.nothing_written}[outcome.tests]


@SIGNALS.add
def efficiency(outcome: CodingOutcome, reward: Any) -> float:
    """1.0 up to `best_turns`; then the score of the first step [fraction of max_turns, score]
    whose bound is not exceeded; `floor` beyond the last step."""
    e = reward.efficiency
    if outcome.turns_used <= e.best_turns:
        return 1.0
    for fraction, score in e.steps:
        if outcome.turns_used <= int(outcome.max_turns * fraction):
            return score
    return e.floor


@SIGNALS.add
def tool_usage(outcome: CodingOutcome, reward: Any) -> float:
    """Credit for running code (terminal) after writing it (write_file or patch)."""
    used, t = set(outcome.tools_used), reward.tool_usage
    if "terminal" in used and used & {"write_file", "patch"}:
        return t.write_and_run
    if "terminal" in used:
        return t.run_only
    return t.other if used else 0.0
