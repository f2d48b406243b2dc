"""A rubric: named reward signals, their weights and the rules on the total (as verifiers' `Rubric`).

A signal is a small function of a rollout's outcome (and the reward config) that returns a raw
value, e.g. 1.0 when the answer is correct. The rubric owns the whole score, in one place:
score = sum(weight x value), then an optional flat penalty (a signal that, when set, replaces the
total with a fixed score, as the reference's -1 for a broken format), then an optional clamp; and
whether a rollout passed (a signal at or above a threshold). The raw values are recorded per rollout
(`overrides[i].reward_signals`) and logged as `reward/<name>`, so a signal with weight 0 is still
visible, and anything that asks "was it correct" reads a signal, never the weighted score.
Config keys under `reward.weights` are the signal names; the rubric refuses weights that do not
name its signals one to one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from opd.registry import Registry

O = TypeVar("O")
SignalFn = Callable[[O, Any], float]


class Signals(Generic[O]):
    """The signals of one environment, in order; `@SIGNALS.add` registers a function by its name
    (a name registered twice is refused)."""

    def __init__(self) -> None:
        self.registry: Registry[SignalFn] = Registry("reward signal", "reward.weights")

    def add(self, fn: SignalFn) -> SignalFn:
        return self.registry.add(fn.__name__, fn)

    def __iter__(self) -> Iterator[tuple[str, SignalFn]]:
        return self.registry.items()

    @property
    def names(self) -> list[str]:
        return self.registry.names


@dataclass(frozen=True)
class Scored:
    """A rollout's reward: the weighted total and every signal's raw value."""

    total: float
    signals: dict[str, float]


@dataclass(frozen=True)
class FlatPenalty:
    """When `signal` is non-zero the total is `score`, whatever the other signals say."""

    signal: str
    score: float


@dataclass(frozen=True)
class PassRule:
    """A rollout passed when `signal` >= `threshold` (the reference's coding pass rate: 0.8)."""

    signal: str
    threshold: float


class RubricError(ValueError):
    """Weights or rules that do not match the rubric's signals; `key` is the config key to fix."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class Rubric(Generic[O]):
    def __init__(self, signals: Signals[O], weights: Mapping[str, float] | Any, params: Any = None, *,
                 penalty: FlatPenalty | None = None, clamp: tuple[float, float] | None = None, passing: PassRule | None = None) -> None:
        weights = asdict(weights) if is_dataclass(weights) else dict(weights)
        missing, extra = set(signals.names) - set(weights), set(weights) - set(signals.names)
        if missing or extra:
            near = "".join(f"; {name}: did you mean {close}?" for name in sorted(extra) if (close := signals.registry.nearest(name)))
            raise RubricError(f"reward.weights must name the signals {signals.names} one to one (missing {sorted(missing)}, unknown {sorted(extra)}{near})",
                              "reward.weights")
        for rule, key in ((penalty, "reward.format_penalty"), (passing, "reward.pass_threshold")):
            if rule is not None and rule.signal not in signals.names:
                raise RubricError(f"{key}: the rubric has no signal {rule.signal!r} (signals: {signals.names})", key)
        if clamp is not None and not clamp[0] <= clamp[1]:
            raise RubricError(f"reward.clamp must be [low, high] with low <= high, got {list(clamp)}", "reward.clamp")
        self.signals = signals
        self.weights = {name: float(weights[name]) for name in signals.names}
        self.params = params
        self.penalty, self.clamp, self.passing = penalty, clamp, passing

    def score(self, outcome: O) -> Scored:
        """Every signal's raw value and the total: the weighted sum, the flat penalty where its
        signal is set, clamped."""
        values = {name: float(fn(outcome, self.params)) for name, fn in self.signals}
        total = sum(self.weights[name] * value for name, value in values.items())
        if self.penalty is not None and values[self.penalty.signal]:
            total = self.penalty.score
        if self.clamp is not None:
            total = min(self.clamp[1], max(self.clamp[0], total))
        return Scored(total, values)

    def passed(self, signals: Mapping[str, float]) -> bool:
        """Did a rollout with these raw signal values pass? (No pass rule: never.)"""
        return self.passing is not None and signals[self.passing.signal] >= self.passing.threshold
