"""What the viewer's index shows of a group: its environment and a few counts per group.

The environment is read off the record's shape: opd_coding groups carry the chat (`messages`) and,
with OPD, `distill_token_ids`; inline_math groups carry the reference `answer`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# The index's columns, in the order `summarise` returns them (the page reads them by name).
COLUMNS = ["group", "item", "env", "rollouts", "score_mean", "score_std", "score_min", "score_max",
           "passed", "failed", "hinted_turns", "scored_turns", "format_violations", "tool_calls", "tool_errors", "judged_turns"]


def env_of(group: dict[str, Any]) -> str:
    """The environment that wrote the group (`group_overrides.env`); for records written before
    it was recorded, opd_coding or inline_math by their shape, or unknown (a record from elsewhere)."""
    named = (group.get("group_overrides") or {}).get("env")
    if isinstance(named, str) and named:
        return named
    if group.get("messages") is not None or group.get("distill_token_ids") is not None:
        return "opd_coding"
    if "answer" in (group.get("group_overrides") or {}):
        return "inline_math"
    return "unknown"


def passed(env: str, detail: dict[str, Any]) -> bool | None:
    """Whether one rollout solved its task, as its environment wrote it (`passed`; older records:
    inline_math's `correct`, opd_coding's tests); None when the record does not say."""
    if isinstance(detail.get("passed"), bool):
        return detail["passed"]
    if env == "inline_math" and "correct" in detail:
        return bool(detail["correct"])
    if env == "opd_coding" and "tests" in detail:
        return detail["tests"] == "pass"
    return None


def tool_calls(detail: dict[str, Any]) -> int:
    """Calls that reached a tool: inline_math counts them, opd_coding lists their names."""
    if isinstance(detail.get("tool_calls"), int):
        return detail["tool_calls"]
    return len(detail.get("tools_used") or [])


def hinted(turn: dict[str, Any]) -> bool:
    return bool(turn.get("hint"))


def summarise(index: int, group: dict[str, Any]) -> list[Any]:
    """One index row (values in `COLUMNS` order) for the group at line `index` of its file; every
    number finite or None (the page reads the row as JSON, which has no NaN). Raises ValueError
    for a score that is not a finite number."""
    env = env_of(group)
    scores = [float(s) for s in group.get("scores") or []]
    if not all(math.isfinite(s) for s in scores):
        raise ValueError(f"scores must be finite numbers: {[s for s in scores if not math.isfinite(s)][:3]}")
    details = group.get("overrides") or [{} for _ in scores]
    outcomes = [passed(env, d) for d in details]
    turns = [t for d in details for t in d.get("opd_turns") or []]
    with np.errstate(all="ignore"):  # scores near the float limit: a mean or spread past it is shown as unknown
        mean, std = (float(np.mean(scores)), float(np.std(scores))) if scores else (0.0, 0.0)
    return [
        index,
        str((group.get("group_overrides") or {}).get("item_id", "")),
        env,
        len(scores),
        _rounded(mean),
        _rounded(std),
        round(min(scores), 4) if scores else 0.0,
        round(max(scores), 4) if scores else 0.0,
        sum(o is True for o in outcomes),
        sum(o is False for o in outcomes),
        sum(hinted(t) for t in turns),
        sum(bool(t.get("scored")) for t in turns),
        sum((d.get("reward_signals") or {}).get("format_violation", 0) > 0 for d in details),
        sum(tool_calls(d) for d in details),
        sum(int(d.get("tool_errors") or 0) for d in details),
        len(turns),
    ]


def _rounded(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None
