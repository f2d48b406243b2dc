"""The records viewer: HTML size and time to write for 100 / 1,000 / 10,000 opd_coding-like groups,
and for the largest, how long headless Chromium takes to show the index and to open a group."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from experiments.bench.common import FIXTURE, ROOT, median

logger = logging.getLogger(__name__)

ROLLOUTS = 4
PROMPT_TOKENS = 200
TURNS = (150, 100, 50)  # generated tokens per assistant turn
TOOL_TOKENS = 50  # each tool response the environment inserts between turns
TOKENS = PROMPT_TOKENS + sum(TURNS) + TOOL_TOKENS * (len(TURNS) - 1)  # per rollout: 600
# Teacher rows on turn 1 of even rollouts, turns 2 and 3 of odd ones: 150 of 600 either way.
TEACHER_ROW_SHARE = TURNS[0] / TOKENS
K = 20
DISTINCT = 40  # distinct groups generated; the file repeats them under new item ids


class Corpus:
    """Token ids of real text (this repository's README, docs and code) to draw windows from, and their
    frequencies, so generated turns and teacher alternatives have text-like statistics."""

    def __init__(self, tokenizer: Any) -> None:
        text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "opd").rglob("*.py"))])
        self.ids = np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
        counts = np.bincount(self.ids, minlength=len(tokenizer)).astype(np.float64) + 0.05
        self.frequency = counts / counts.sum()

    def window(self, rng: np.random.Generator, n: int) -> list[int]:
        start = int(rng.integers(0, self.ids.size - n))
        return self.ids[start : start + n].tolist()


def synthetic_group(tokenizer: Any, corpus: Corpus, rng: np.random.Generator, item: str) -> dict[str, Any]:
    """An opd_coding-like group: 4 rollouts of a 200-token prompt and three assistant turns (150,
    100, 50 tokens) with a 50-token tool response after each of the first two (600 tokens), and
    teacher rows (K=20, the sampled token among them) on a quarter of the positions."""
    from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, Sequence, check_group

    eos = tokenizer.eos_token_id
    prompt = corpus.window(rng, PROMPT_TOKENS)
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [], "distill_token_ids": [], "distill_logprobs": [],
                             "overrides": [], "messages": [], "advantages": None, "ref_logprobs": None,
                             "generation_params": {"max_tokens_per_turn": 256}, "group_overrides": {"item_id": item, "opd_wall_s": 1.5}}
    for r in range(ROLLOUTS):
        seq = Sequence.from_prompt(prompt)
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful Python programmer."},
                                          {"role": "user", "content": tokenizer.decode(prompt)}]
        turns, spans = [], []
        for t, length in enumerate(TURNS):
            ids = corpus.window(rng, length - 1) + [eos]
            start = len(seq.tokens)
            seq.add_generated(ids, (-rng.exponential(0.7, length)).tolist())
            spans.append((start, len(seq.tokens)))
            messages.append({"role": "assistant", "content": tokenizer.decode(ids[:-1])})
            if t < len(TURNS) - 1:
                tool = corpus.window(rng, TOOL_TOKENS)
                seq.add_inserted(tool)
                messages.append({"role": "tool", "content": tokenizer.decode(tool)})
        n = len(seq.tokens)
        row_ids = [[DISTILL_PAD_ID] * K for _ in range(n)]
        row_lps = [[DISTILL_PAD_LOGPROB] * K for _ in range(n)]
        teacher: list[float | None] = [None] * n
        hinted = {0} if r % 2 == 0 else {1, 2}
        for t, (start, end) in enumerate(spans):
            if t not in hinted:
                continue
            for p in range(start, end):
                others = rng.choice(corpus.frequency.size, size=K + 4, replace=False, p=corpus.frequency)
                alternatives = [int(i) for i in others if i != seq.tokens[p]][: K - 1]
                lps = np.sort(-np.cumsum(rng.exponential(0.8, K)))[::-1]
                at = int(rng.integers(0, K))
                ids = alternatives[:at] + [seq.tokens[p]] + alternatives[at:]
                row_ids[p], row_lps[p] = ids, lps.tolist()
                teacher[p] = float(lps[at])
        for t, (start, end) in enumerate(spans[:-1]):  # the last turn has no next state: not judged
            votes = [int(v) for v in rng.choice([1, -1], 3)]
            turns.append({"span": [start, end], "message_index": 2 + 2 * t, "next_state_role": "tool", "votes": votes,
                          "decision": 1 if t in hinted else -1, "hint": "Run the tests before answering." if t in hinted else None,
                          "scored": t in hinted, "error": None})
        group["tokens"].append(seq.tokens)
        group["masks"].append(seq.masks)
        group["inference_logprobs"].append(seq.logprobs)
        group["distill_token_ids"].append(row_ids)
        group["distill_logprobs"].append(row_lps)
        group["scores"].append(float(rng.uniform(0, 1)))
        group["messages"].append(messages)
        group["overrides"].append({"reward_signals": {"correctness": float(rng.choice([0.0, 0.4, 1.0])), "efficiency": 0.8, "tool_usage": 1.0},
                                   "tests": str(rng.choice(["pass", "fail"])), "turns": len(TURNS), "tools_used": ["write_file", "terminal"],
                                   "tool_errors": 0, "finish": "answer", "generated_tokens": sum(TURNS), "opd_turns": turns, "teacher_logprobs": teacher})
    problems = check_group(group)
    assert not problems, problems
    return group


def write_records(path: Path, groups: int, tokenizer: Any, corpus: Corpus) -> None:
    """`groups` lines: DISTINCT generated groups repeated under new item ids (every line is parsed
    and packed on its own, so only the generation is shared)."""
    rng = np.random.default_rng(0)
    lines = [json.dumps(synthetic_group(tokenizer, corpus, rng, "ITEM"), separators=(",", ":")).split('"ITEM"') for _ in range(min(DISTINCT, groups))]
    with open(path, "w", encoding="utf-8") as out:
        for g in range(groups):
            before, after = lines[g % len(lines)]
            out.write(f'{before}"synthetic-{g}"{after}\n')


def load_in_chromium(html: Path) -> dict[str, float]:
    """Seconds until the page's index is drawn (its own clock, and ours around it), until the whole
    file is parsed, and to open a group and one rollout's tokens once it is."""
    from experiments.bench.chromium import Chromium

    with Chromium(timeout_s=600) as browser:
        started = time.perf_counter()
        browser.goto(html.as_uri())
        browser.wait_for("document.documentElement && document.documentElement.dataset.indexMs", timeout_s=600)
        index_wall = time.perf_counter() - started
        index_ms = float(browser.evaluate("document.documentElement.dataset.indexMs"))
        paint_ms = float(browser.wait_for("document.documentElement.dataset.indexPaintMs", timeout_s=600))
        browser.wait_for("document.readyState !== 'loading'", timeout_s=600)
        parsed_wall = time.perf_counter() - started
        last = browser.evaluate("document.querySelectorAll('#index-rows tr[data-g]').length") - 1
        opened = time.perf_counter()
        browser.evaluate(f"document.querySelector('#index-rows tr[data-g=\"{last}\"]').click()")
        browser.wait_for("document.querySelectorAll('.rollouts tr[data-r]').length > 0")
        browser.evaluate("document.querySelector('.rollouts tr[data-r=\"0\"]').click()")
        browser.wait_for("!!document.getElementById('tokens')")
        open_s = time.perf_counter() - opened
        assert not browser.page_errors, browser.page_errors
    return {"index_s": index_ms / 1000, "index_painted_s": paint_ms / 1000, "index_wall_s": index_wall, "parsed_wall_s": parsed_wall, "open_group_s": open_s}


def bench_viewer(repeats: int, sizes: tuple[int, ...] = (100, 1000, 10000), overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Write the viewer of N synthetic groups (median of `repeats` below 10,000 groups, one run at
    10,000); load the largest in headless Chromium (skipped without chromium)."""
    from transformers import AutoTokenizer

    from experiments.bench.chromium import chromium_binary
    from opd.records.viewer import write_viewer

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURE))
    corpus = Corpus(tokenizer)
    with tempfile.TemporaryDirectory(prefix="opd-bench-viewer-") as tmp:
        for groups in sizes:
            records, html = Path(tmp) / f"groups{groups}.jsonl", Path(tmp) / f"groups{groups}.html"
            write_records(records, groups, tokenizer, corpus)
            times = []
            for _ in range(repeats if groups < 10000 else 1):
                started = time.perf_counter()
                write_viewer(records, tokenizer, html)
                times.append(time.perf_counter() - started)
            result = {"bench": "viewer", "groups": groups, "rollouts": ROLLOUTS, "tokens_per_rollout": TOKENS, "k": K, "teacher_row_share": TEACHER_ROW_SHARE,
                      "records_bytes": records.stat().st_size, "html_bytes": html.stat().st_size, "write_s": median(times), "write_s_each": times}
            if groups == max(sizes) and chromium_binary() is not None:
                result.update(load_in_chromium(html))
            records.unlink()
            html.unlink()
            yield result
