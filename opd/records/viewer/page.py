"""An HTML viewer of a groups.jsonl, rendered by atroposlib's jsonl2html from decoded sequences."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from opd.records import MASK, read_groups

logger = logging.getLogger(__name__)


def render_sequence(tokenizer, tokens: list[int], masks: list[int]) -> str:
    """The prompt, then the rollout with inserted (masked) spans marked as such."""
    first = next((i for i, m in enumerate(masks) if m != MASK), len(tokens))
    parts = [tokenizer.decode(tokens[:first], skip_special_tokens=False), "\n\n---- rollout ----\n"]
    start = first
    for i in range(first, len(tokens) + 1):
        if i == len(tokens) or (masks[i] == MASK) != (masks[start] == MASK):
            text = tokenizer.decode(tokens[start:i], skip_special_tokens=False)
            parts.append(f"[inserted]{text}[/inserted]" if masks[start] == MASK else text)
            start = i
    return "".join(parts)


def write_viewer(groups_path: Path, tokenizer, html_path: Path) -> Path:
    """Write `html_path`; returns it. Raises RuntimeError if atroposlib's renderer gives up."""
    from atroposlib.frontend.jsonl2html import generate_html

    with tempfile.TemporaryDirectory() as tmp:
        view = Path(tmp) / "view.jsonl"
        with open(view, "w", encoding="utf-8") as out:
            for group in read_groups(groups_path):
                texts = [render_sequence(tokenizer, t, m) for t, m in zip(group["tokens"], group["masks"])]
                out.write(json.dumps({"messages": texts, "scores": group["scores"]}) + "\n")
        try:
            generate_html(str(view), str(html_path))
        except SystemExit as err:  # jsonl2html calls sys.exit on I/O errors
            raise RuntimeError(f"jsonl2html could not render {groups_path} (exit {err.code})") from None
    return html_path
