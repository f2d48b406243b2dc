"""A prompt shared by several sequences, run through the model once.

A group's rollouts share their prompt (one prompt, `group_size` samples), and with few-shot
examples the prompt is most of each sequence. The common prefix runs once, batch 1; its keys and
values serve every sequence (gradients flow back through them); only the rest runs per sequence.
The result is the padded forward pass's, to float precision (tests/test_train.py, tests/test_fixture.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a forward pass runs: the prefix's length needs none
    import torch


def shared_prefix_length(rows: list[tuple[list[int], list[bool]]]) -> int:
    """How many leading ids every (ids, trained) row shares, stopping before the position whose
    logits predict the first trained token (so no trained position falls in the prefix)."""
    first_trained = min(next((i for i, t in enumerate(trained) if t), len(trained)) for _, trained in rows)
    limit = min(min(len(ids) for ids, _ in rows), first_trained - 1)
    first_ids = rows[0][0]
    for k in range(max(0, limit)):
        if any(ids[k] != first_ids[k] for ids, _ in rows):
            return k
    return max(0, limit)


def run_prefix(model: Any, prefix_ids: torch.Tensor) -> tuple[Any, Any]:
    """(the model's output on `prefix_ids` [1, P], last position's logits only; the cache of its keys and values)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    return model(input_ids=prefix_ids, past_key_values=cache, use_cache=True, logits_to_keep=1), cache


def expanded(model: Any, prefix_cache: Any, rows: int) -> Any:
    """A new cache holding `prefix_cache`'s keys and values for `rows` sequences (views, not copies)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, held in enumerate(prefix_cache.layers):
        cache.update(held.keys.expand(rows, -1, -1, -1), held.values.expand(rows, -1, -1, -1), layer)
    return cache


def logits_after_prefix(model: Any, tokens: torch.Tensor, attention: torch.Tensor, prefix: int) -> torch.Tensor:
    """Logits [B, T - prefix + 1, V] at positions prefix - 1 .. T - 1 of right-padded `tokens`
    [B, T] whose first `prefix` ids are the same in every row: the prefix runs once. (Position
    prefix - 1's logits, which predict the first position after the prefix, are the prefix run's last.)"""
    import torch

    rows = tokens.shape[0]
    out, prefix_cache = run_prefix(model, tokens[:1, :prefix])
    cache = expanded(model, prefix_cache, rows)
    mask = torch.cat([torch.ones(rows, prefix, dtype=torch.long), attention[:, prefix:].long()], dim=1)
    rest = model(input_ids=tokens[:, prefix:], attention_mask=mask, past_key_values=cache, use_cache=True).logits
    return torch.cat([out.logits[:, -1:].expand(rows, -1, -1), rest], dim=1)
