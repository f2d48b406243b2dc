"""The record format: Atropos `ScoredDataGroup` groups, one JSON object per line of groups.jsonl.

Per group (lists are per sequence, inner lists per token position):
- `tokens` [seq][pos]: prompt + sampled token ids, exactly as the server saw and produced them.
- `masks` [seq][pos]: the token id where the model generated it (trained), `MASK` elsewhere
  (prompt, and text the environment inserted, such as tool responses).
- `inference_logprobs` [seq][pos]: the sampling model's logprob of each generated token;
  `MASKED_LOGPROB` (atroposlib's placeholder, not a log probability) on masked positions.
- `scores` [seq]: the reward. `overrides` [seq]: per-sequence details (reward signals, tool calls).
- `distill_token_ids` / `distill_logprobs` [seq][pos][K] (OPD only): the teacher's top-K on the
  tokens of hinted turns, K pads elsewhere.

The rules a group must satisfy are in `opd.records.rules`; this module holds the constants and
`Sequence`, which builds one sequence's aligned rows while a rollout runs.
"""

from __future__ import annotations

from dataclasses import dataclass

MASK = -100
# Logprob stored at positions the model did not generate (atroposlib's placeholder).
MASKED_LOGPROB = 1.0
# Pads of distill rows at positions without a teacher row: no real token has id -1, and
# e^-1e9 is 0, so a pad can never be read as a prediction.
DISTILL_PAD_ID = -1
DISTILL_PAD_LOGPROB = -1e9


@dataclass
class Sequence:
    """One rollout's aligned rows as it grows: prompt, generated and inserted tokens."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]

    @classmethod
    def from_prompt(cls, prompt_ids: list[int]) -> "Sequence":
        return cls(list(prompt_ids), [MASK] * len(prompt_ids), [MASKED_LOGPROB] * len(prompt_ids))

    def add_generated(self, token_ids: list[int], logprobs: list[float]) -> None:
        """Sampled tokens: trained (mask = id) with the sampler's logprobs."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} sampled ids with {len(logprobs)} logprobs")
        self.tokens += token_ids
        self.masks += token_ids
        self.logprobs += logprobs

    def add_inserted(self, token_ids: list[int]) -> None:
        """Tokens the environment inserted (tool responses, the template's turn markers): masked."""
        self.tokens += token_ids
        self.masks += [MASK] * len(token_ids)
        self.logprobs += [MASKED_LOGPROB] * len(token_ids)
