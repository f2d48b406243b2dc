"""A deterministic held-out split that training and evaluation (and the fixture build) share."""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


def train_eval_split(rows: Sequence[T], eval_size: int, seed: int) -> tuple[list[T], list[T]]:
    """Shuffle indices with `seed`; the first `eval_size` are held out. Same input, same split."""
    if not 0 <= eval_size < len(rows):
        raise ValueError(f"eval_size must be in [0, {len(rows) - 1}] for {len(rows)} rows, got {eval_size}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:eval_size])
    train = [row for i, row in enumerate(rows) if i not in held]
    return train, [rows[i] for i in order[:eval_size]]
