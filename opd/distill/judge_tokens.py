"""What the judge's server must never read as a control token in the text it judges.

The judge's server tokenizes the chat it is sent itself (vLLM's chat route parses special tokens in
message text), so the text quoted to it, the policy's turn and its tools' output, is defused for
the judge's own tokenizer: each of its added tokens' text broken by an invisible word joiner
(`opd.agent.chat_tokens.defuse`). A judge on the policy's server (`judge=policy`) has the policy's
tokenizer. `judge=server` may run another family: its tokenizer is `judge.tokenizer`, or
`judge.model` when that is a local directory or a model in the Hugging Face cache, and the text is
defused for it and for the policy's. A judge whose tokenizer cannot be had gets every string
shaped like any family's control token defused (`SHAPES`: `<|...|>`, `<｜...｜>`, `[INST]`,
`[control_8]`, `<s>`, `<start_of_turn>`, ...), with a warning that names the fix.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opd.agent.chat_tokens import WORD_JOINER, defuse
from opd.config import ConfigError

logger = logging.getLogger(__name__)

# The shapes every known family's control tokens take (Qwen, Llama 3, gpt-oss, DeepSeek, Mistral,
# Gemma, Phi): defused when the judge's own tokenizer is unknown.
SHAPES = re.compile(r"<\|[^<>|\s]{1,64}\|>|<｜[^<>｜]{1,64}｜>|\[/?[A-Z][A-Z0-9_]{1,31}\]|\[control_\d{1,4}\]|</?[A-Za-z][A-Za-z0-9_]{0,31}>")


def _break(match: re.Match[str]) -> str:
    text = match.group(0)
    return text[0] + WORD_JOINER + text[1:]


@dataclass(frozen=True)
class JudgeDefuser:
    """Defuses text for the judge: the added tokens of each tokenizer in `tokenizers`, and with
    `shapes` every control-token-shaped string."""

    tokenizers: tuple[Any, ...]
    shapes: bool = False

    def __call__(self, text: str) -> str:
        for tokenizer in self.tokenizers:
            text = defuse(tokenizer, text)
        return SHAPES.sub(_break, text) if self.shapes else text


def judge_defuser(judge: Any, policy_tokenizer: Any) -> JudgeDefuser:
    """The defuser of the judge of `judge` (a `JudgeConfig`) over a policy of `policy_tokenizer`."""
    if judge.kind != "server":
        return JudgeDefuser((policy_tokenizer,))
    own = judge_tokenizer(judge)
    if own is None:
        logger.warning("judge.tokenizer: judge.model=%r is not a local model nor one in the Hugging Face cache, so the judge's tokenizer is "
                       "unknown: text quoted to it is defused for every string shaped like a control token of any family; "
                       "set judge.tokenizer=<its model directory or hub name> to defuse exactly its own", judge.model)
        return JudgeDefuser((policy_tokenizer,), shapes=True)
    return JudgeDefuser((own, policy_tokenizer))


def judge_tokenizer(judge: Any) -> Any | None:
    """judge=server's tokenizer: `judge.tokenizer` (a `ConfigError` naming it when it cannot be
    loaded), else `judge.model` when it is a local directory or cached hub model, else None."""
    from opd.serving.model_lookup import find_model
    from opd.serving.tokenizer import load_tokenizer

    name = getattr(judge, "tokenizer", None)
    if name:
        found = find_model(name, "judge.tokenizer")
        try:
            return load_tokenizer(found)
        except Exception as err:  # noqa: BLE001 - any loader failure is the key's fault
            raise ConfigError(f"judge.tokenizer={name!r}: cannot load a tokenizer from it: {type(err).__name__}: {err}", "judge.tokenizer") from None
    if not _local(judge.model):
        return None
    try:
        return load_tokenizer(judge.model)
    except Exception as err:  # noqa: BLE001 - a model without tokenizer files: the shapes stand in
        logger.warning("judge.model=%r: no tokenizer could be loaded from it (%s: %s)", judge.model, type(err).__name__, err)
        return None


def _local(name: str) -> bool:
    """`name` is a local directory or a hub model whose tokenizer is in the local cache (no network)."""
    if Path(name).expanduser().is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(isinstance(try_to_load_from_cache(name, file), str) for file in ("tokenizer.json", "tokenizer_config.json"))
    except Exception:  # noqa: BLE001 - not a hub name
        return False
