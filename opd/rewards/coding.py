"""opd_coding reward signals: correctness, efficiency, tool usage (names match `reward.weights`).

Correctness comes from the task's own tests, run by the reward: only the agent's `solution.py`
is copied into a fresh directory next to the task's test file, so nothing else the agent wrote
(its own test files included) can affect the verdict. The test run must print a per-run random
marker after the last assertion, so a solution that exits early with status 0 does not pass.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from opd.tools.sandbox import SandboxLimits
from opd.tools.workspace import Workspace

SOLUTION = "solution.py"
TASK_TESTS = "_task_tests.py"


@dataclass(frozen=True)
class TestOutcome:
    """What running the task's tests against the solution gave."""

    level: str  # pass | assertion | crash | nothing_written
    output: str


async def run_task_tests(solution_dir: Path, test_code: str, limits: SandboxLimits) -> TestOutcome:
    solution = solution_dir / SOLUTION
    if not solution.is_file() or solution.is_symlink():
        return TestOutcome("nothing_written", "")
    marker = f"opd-tests-completed-{secrets.token_hex(8)}"
    workspace = Workspace(limits)
    try:
        written = workspace.write_file(SOLUTION, solution.read_text(encoding="utf-8", errors="replace"))
        if written.startswith("error:"):
            return TestOutcome("crash", written)
        workspace.write_file(TASK_TESTS, f"{test_code}\nprint({marker!r})\n")
        output = await workspace.terminal(f"python {TASK_TESTS}")
    finally:
        workspace.close()
    if output.endswith("[exit code 0]") and marker in output:
        return TestOutcome("pass", output)
    if "AssertionError" in output:
        return TestOutcome("assertion", output)
    return TestOutcome("crash", output)


def correctness(outcome: TestOutcome, levels: dict[str, float]) -> float:
    """The configured credit for the outcome's level (pass, assertion, crash, nothing_written)."""
    return levels[outcome.level]


def efficiency(turns_used: int, max_turns: int, best_turns: int, steps: list[list[float]], floor: float) -> float:
    """1.0 up to `best_turns`; then the score of the first step [fraction of max_turns, score]
    whose bound is not exceeded; `floor` beyond the last step."""
    if turns_used <= best_turns:
        return 1.0
    for fraction, score in steps:
        if turns_used <= int(max_turns * fraction):
            return score
    return floor


def tool_usage(tools_used: list[str], write_and_run: float, run_only: float, other: float) -> float:
    """Credit for running code (terminal) after writing it (write_file or patch)."""
    used = set(tools_used)
    if "terminal" in used and used & {"write_file", "patch"}:
        return write_and_run
    if "terminal" in used:
        return run_only
    return other if used else 0.0
