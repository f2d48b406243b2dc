"""The items and prompts of the OPD experiment as the project's own env makes them, in one JSON
file that the plain loop reads: the training and held-out split of `dataset=math_builtin` (all nine
kinds), each prompt rendered by `InlineMathEnv.prompt_ids` without the dynamic few-shots, the
answers, and the special tokens of the fixture's tool format.

    python -m experiments.opd_plain.bundle --out bundle.json
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from experiments.bench.common import compose, environment

logger = logging.getLogger(__name__)


def make_bundle(model: str = "fixture_student") -> dict[str, Any]:
    """Every training and held-out item of the experiment's dataset, with its prompt ids."""
    # experiment=opd_vs_grpo's env and dataset (its teacher server is the loop's own model here).
    cfg = compose(["experiment=closed_loop_inline_math", "dataset.kinds=null", f"server.model={model}"])
    env = environment(cfg, "http://127.0.0.1:9/v1")
    fmt = env.chat_format

    def rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"id": item.get("id"), "kind": item.get("kind"), "answer": item["answer"], "prompt_ids": env.prompt_ids(item["problem"], use_pool=False)}
                for item in items]

    tokenizer = env.tokenizer
    ids = {name: tokenizer.convert_tokens_to_ids(text) for name, text in
           (("call_start", fmt.call_start), ("call_end", fmt.call_end), ("eos", tokenizer.eos_token), ("reasoning_end", fmt.reasoning_end))}
    return {
        "train": rows(env.data.train),
        "eval": rows(env.data.eval),
        "tokens": ids,
        "text": {"call_start": fmt.call_start, "call_end": fmt.call_end, "reasoning_end": fmt.reasoning_end},
        "limits": {"max_tool_calls": cfg.env.max_tool_calls, "max_new_tokens": cfg.env.max_new_tokens, "max_answer_chars": cfg.reward.max_answer_chars},
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the bundle file to write")
    args = parser.parse_args()
    bundle = make_bundle()
    args.out.write_text(json.dumps(bundle))
    logger.info("%s: %d training and %d held-out items", args.out, len(bundle["train"]), len(bundle["eval"]))


if __name__ == "__main__":
    main()
