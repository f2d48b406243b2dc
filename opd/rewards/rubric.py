"""A rubric: named reward signals and their weights (as verifiers' `Rubric`).

A signal is a small function of a rollout's outcome (and the reward config) that returns a raw
value, e.g. 1.0 when the answer is correct. The rubric computes every signal and combines them
in one place: score = sum(weight x value). The raw values are recorded per rollout
(`overrides[i].reward_signals`) and logged as `reward/<name>`, so a signal with weight 0 is still
visible, and anything that asks "was it correct" reads a signal, never the weighted score.
Config keys under `reward.weights` are the signal names; the rubric refuses weights that do not
name its signals one to one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

O = TypeVar("O")
SignalFn = Callable[[O, Any], float]


class Signals(Generic[O]):
    """The signals of one environment, in order; `@SIGNALS.add` registers a function by its name."""

    def __init__(self) -> None:
        self._fns: dict[str, SignalFn] = {}

    def add(self, fn: SignalFn) -> SignalFn:
        self._fns[fn.__name__] = fn
        return fn

    def __iter__(self) -> Iterator[tuple[str, SignalFn]]:
        return iter(self._fns.items())

    @property
    def names(self) -> list[str]:
        return list(self._fns)


@dataclass(frozen=True)
class Scored:
    """A rollout's reward: the weighted total and every signal's raw value."""

    total: float
    signals: dict[str, float]


class Rubric(Generic[O]):
    def __init__(self, signals: Signals[O], weights: Mapping[str, float] | Any, params: Any = None) -> None:
        weights = asdict(weights) if is_dataclass(weights) else dict(weights)
        missing, extra = set(signals.names) - set(weights), set(weights) - set(signals.names)
        if missing or extra:
            raise ValueError(f"reward.weights must name the signals {signals.names} one to one (missing {sorted(missing)}, unknown {sorted(extra)})")
        self.signals = signals
        self.weights = {name: float(weights[name]) for name in signals.names}
        self.params = params

    def score(self, outcome: O) -> Scored:
        values = {name: float(fn(outcome, self.params)) for name, fn in self.signals}
        return Scored(sum(self.weights[name] * value for name, value in values.items()), values)
