"""opd_coding's reward: the task's tests and the signals (names match `reward.weights`).

- `correctness`: the configured credit for how the task's tests went (`correctness_levels`);
- `efficiency`: by assistant turns used; `tool_usage`: writing code and running it.
Each is a raw value in [0, 1]; the weights make the score.

Correctness comes from the task's own tests, run by the reward in `opd.rewards.harness`: only
the agent's `solution.py` takes part, and the verdict comes from a process the solution cannot
reach, so nothing else the agent wrote (its own tests included) and nothing the solution prints or
exits with can change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opd.config import OPDCodingRewardConfig, SandboxConfig
from opd.rewards.harness import TestOutcome, run_tests
from opd.rewards.rubric import PassRule, Rubric, Signals
from opd.tools.registry import ToolError
from opd.tools.workspace import Workspace

SOLUTION = "solution.py"


async def run_task_tests(workspace: Workspace, test_code: str, limits: SandboxConfig, max_solution_chars: int) -> TestOutcome:
    """The task's own tests against the workspace's solution.py, in the harness (no file the agent
    wrote but solution.py takes part, and the verdict cannot be forged)."""
    try:
        data = workspace.read_bytes(SOLUTION, 4 * max_solution_chars)
    except ToolError as err:
        return TestOutcome("nothing_written", str(err))
    source = data.decode("utf-8", errors="replace")
    if len(source) > max_solution_chars:
        return TestOutcome("crash", f"solution.py is longer than reward.max_solution_chars={max_solution_chars}")
    return await run_tests(source, test_code, limits)


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


def rubric(cfg: OPDCodingRewardConfig) -> Rubric[CodingOutcome]:
    """opd_coding's whole score: the weighted signals clamped to `reward.clamp` (the reference's
    [0, 1]); a rollout passed when its correctness signal reaches `reward.pass_threshold`."""
    clamp = (float(cfg.clamp[0]), float(cfg.clamp[1])) if cfg.clamp is not None else None
    return Rubric(SIGNALS, cfg.weights, params=cfg, clamp=clamp, passing=PassRule("correctness", cfg.pass_threshold))
