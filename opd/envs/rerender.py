"""A records file's rollouts against the chat template of the model that wrote them: what
`python -m opd.records check --rerender` runs (the comparison itself: `opd.agent.rerender`).

The run's `config.yaml` (beside its `groups.jsonl`) names the model preset's format and the
tokenizer's directory; each group's environment names its tools and how its tool messages hold
their results.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from opd.agent.chat_format import ChatFormat
from opd.agent.rerender import Difference, rerender
from opd.envs import coding_prompt, math_prompt

# The tools each of the project's environments shows the model (they are part of the prompt).
TOOLS: dict[str, list[dict[str, Any]]] = {"inline_math": math_prompt.TOOLS, "opd_coding": coding_prompt.TOOLS}
# Environments whose tool messages hold a result's JSON, which the template is given as the object.
JSON_RESULTS = frozenset({"inline_math"})


class RerenderError(ValueError):
    """The run's config or tokenizer cannot be had, so nothing can be re-rendered."""


@dataclass(frozen=True)
class Renderer:
    """The tokenizer and chat format of the model that wrote a records file."""

    tokenizer: Any
    fmt: ChatFormat

    @classmethod
    def for_run(cls, config: Path, tokenizer_dir: Path | None = None, resolve: Callable[[str], str] = str) -> "Renderer":
        """From the run's resolved `config.yaml`; the tokenizer from `tokenizer_dir`, else the
        served model's (`server.model`, found by `resolve`: the project's names, a hub model)."""
        from omegaconf import OmegaConf

        from opd.serving.tokenizer import load_tokenizer

        try:
            cfg = OmegaConf.load(config)
        except (OSError, ValueError) as err:
            raise RerenderError(f"{config}: cannot read the run's config ({err}); give it with --config") from None
        model = cfg.get("model")
        if model is None or "tool_call_parser" not in model:
            raise RerenderError(f"{config}: not a run's config.yaml (no model preset in it)")
        source = str(tokenizer_dir) if tokenizer_dir is not None else str(OmegaConf.select(cfg, "server.model", default="") or "")
        if not source:
            raise RerenderError(f"{config}: names no server.model; give the tokenizer's directory with --tokenizer")
        try:
            tokenizer = load_tokenizer(resolve(source) if tokenizer_dir is None else source)
        except (OSError, ValueError) as err:
            raise RerenderError(f"cannot load the tokenizer of {source!r} ({err}); give its directory with --tokenizer") from None
        return cls(tokenizer, ChatFormat.from_config(model))


def rerender_group(group: dict[str, Any], renderer: Renderer) -> list[tuple[int, Difference]]:
    """Each rollout's differences from the template's rendering, as (rollout index, difference)."""
    env = (group.get("group_overrides") or {}).get("env")
    if env not in TOOLS:
        return [(-1, Difference("conversation", 0, (), (), True, f"environment {env!r}: its tools are not known here, so it cannot be re-rendered"))]
    conversations = group.get("messages")
    if not conversations:
        return [(-1, Difference("conversation", 0, (), (), True, "the group keeps no messages (written before inline_math recorded its conversation?)"))]
    out: list[tuple[int, Difference]] = []
    for index, (messages, tokens, masks) in enumerate(zip(conversations, group["tokens"], group["masks"])):
        if not messages:
            out.append((index, Difference("conversation", 0, (), (), True, "no messages for this rollout")))
            continue
        for difference in rerender(renderer.tokenizer, renderer.fmt, TOOLS[env], messages, tokens, masks, env in JSON_RESULTS):
            out.append((index, difference))
    return out
