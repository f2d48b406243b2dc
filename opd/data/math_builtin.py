"""A math problem set the project ships: generated from a seed, exact integer answers.

Problems range from one-step arithmetic with small numbers to two-step word problems, so a tool
call (calculator or python) gives the answer and a model can be checked exactly.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

Problem = dict[str, str]


def _sum(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return {"problem": f"What is {a} + {b}?", "answer": str(a + b), "expression": f"{a} + {b}"}


def _difference(rng: random.Random) -> Problem:
    a, b = rng.randint(20, 199), rng.randint(2, 99)
    return {"problem": f"What is {a} - {b}?", "answer": str(a - b), "expression": f"{a} - {b}"}


def _product(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 40), rng.randint(2, 19)
    return {"problem": f"What is {a} * {b}?", "answer": str(a * b), "expression": f"{a} * {b}"}


def _quotient(rng: random.Random) -> Problem:
    b, q = rng.randint(2, 12), rng.randint(2, 30)
    return {"problem": f"What is {b * q} divided by {b}?", "answer": str(q), "expression": f"{b * q} // {b}"}


def _square(rng: random.Random) -> Problem:
    a = rng.randint(3, 40)
    return {"problem": f"What is {a} squared?", "answer": str(a * a), "expression": f"{a} ** 2"}


def _apples(rng: random.Random) -> Problem:
    boxes, per, eaten = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 5)
    return {
        "problem": f"There are {boxes} boxes with {per} apples each. {eaten} apples are eaten. How many apples are left?",
        "answer": str(boxes * per - eaten),
        "expression": f"{boxes} * {per} - {eaten}",
    }


def _sum_of_range(rng: random.Random) -> Problem:
    n = rng.randint(5, 60)
    return {"problem": f"What is the sum of the integers from 1 to {n}?", "answer": str(n * (n + 1) // 2), "expression": f"sum(range(1, {n} + 1))"}


def _parity(rng: random.Random) -> Problem:
    a = rng.randint(10, 999)
    return {"problem": f"What is the remainder when {a} is divided by 2?", "answer": str(a % 2), "expression": f"{a} % 2"}


def _digit_count(rng: random.Random) -> Problem:
    a = rng.randint(1, 99_999)
    return {"problem": f"How many digits does the number {a} have?", "answer": str(len(str(a))), "expression": f"len(str({a}))"}


# The last two have small answer sets, so even a tiny fixture model answers some correctly.
_KINDS: list[Callable[[random.Random], Problem]] = [_sum, _difference, _product, _quotient, _square, _apples, _sum_of_range, _parity, _digit_count]


# The generator's seed; the held-out split has its own (dataset.split_seed).
GENERATOR_SEED = 1234


KINDS: tuple[str, ...] = tuple(kind.__name__.lstrip("_") for kind in _KINDS)


def generate(n: int = 400, seed: int = GENERATOR_SEED, kinds: Sequence[str] | None = None) -> list[Problem]:
    """`n` distinct problems, the same for the same seed and kinds; each has `problem`, `answer`,
    `expression` and `kind` (the generator's name: sum, parity, ...). `kinds` draws only from
    those generators (None: all)."""
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown or (kinds is not None and not kinds):
        raise ValueError(f"problem kinds {unknown or []} are not the generator's: {list(KINDS)}")
    chosen = [k for k in _KINDS if kinds is None or k.__name__.lstrip("_") in kinds]
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    draws = 0
    while len(problems) < n:
        draws += 1
        if draws > 100 * n:  # the chosen kinds have fewer distinct problems than asked for
            raise ValueError(f"only {len(problems)} distinct problems of kinds {[k.__name__.lstrip('_') for k in chosen]}, {n} asked for")
        kind = rng.choice(chosen)
        problem = {**kind(rng), "kind": kind.__name__.lstrip("_")}
        if problem["problem"] not in seen:
            seen.add(problem["problem"])
            problems.append(problem)
    return problems
