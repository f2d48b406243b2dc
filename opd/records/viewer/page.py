"""`write_viewer`: one self-contained HTML page for a groups.jsonl (no server, no network).

The page holds, in this order: the vocabulary (each token id used, decoded once), the index's
small per-group summaries, the script (which draws the index as soon as it is parsed), then one
deflated blob per group (`payload.pack_group`), inflated by the page only when that group is
opened. The blobs are streamed to a temporary file while the summaries are collected, so memory
stays at one group whatever the file's size.

The records are data, never markup: the page escapes every value it shows, and its Content
Security Policy lets only its own script run (by hash) and load nothing, so even a value that
reached the page unescaped could not run script or fetch anything.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import os
import re
import shutil
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from opd.records.escape import console
from opd.records.reader import LIMITS, Limits, RecordFileError, read_groups
from opd.records.viewer.payload import pack_group
from opd.records.viewer.summary import COLUMNS, summarise
from opd.run_files import check_name

logger = logging.getLogger(__name__)


def _asset(name: str) -> str:
    return resources.files("opd.records.viewer").joinpath(name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no `<` at all, so neither `</script>` nor `<!--`."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script: `sha256-<base64 digest>`."""
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")


def decode_vocabulary(tokenizer: Any, ids: np.ndarray) -> list[str | None]:
    """Text of each id in `ids`, at its index (null elsewhere), decoded by `tokenizer` one id at a
    time: the page shows each token's own piece (a byte of a split character shows as U+FFFD)."""
    table: list[str | None] = [None] * (int(ids.max()) + 1 if ids.size else 0)
    wanted = [int(i) for i in ids]
    try:
        texts = tokenizer.batch_decode([[i] for i in wanted], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception as err:  # noqa: BLE001 - an id the tokenizer lacks: decode one by one below
        logger.warning("decoding the vocabulary in one batch failed (%s); decoding id by id", err)
        texts = []
        for i in wanted:
            try:
                texts.append(tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False))
            except Exception:  # noqa: BLE001 - the page shows the id itself
                texts.append(None)
    for i, text in zip(wanted, texts):
        table[i] = text
    return table


def write_viewer(groups_path: Path, tokenizer: Any, html_path: Path, limits: Limits = LIMITS, *, follow: bool = False) -> Path:
    """Write the viewer of `groups_path` (.jsonl or .jsonl.gz) to `html_path` and return it.
    `tokenizer` (a Hugging Face tokenizer) decodes the token ids. A group that cannot be shown,
    or a line the reader refuses (which ends the reading, as in a file cut by a killed run; the
    reader's `limits` are those of check and resume), is logged and named in the page's header;
    the rest is shown. A file that cannot be read on (a decompression bomb, a line past the cap)
    is a RecordFileError and no page. The page is replaced whole: written under a fresh name
    beside it, renamed over it; a link, a FIFO or a file with other names at `html_path` is
    refused (`opd.run_files`). `follow=True` reads a records file through a link the user named."""
    groups_path, html_path = Path(groups_path), Path(html_path)
    started = time.perf_counter()
    rows: list[list[Any]] = []
    problems: list[str] = []
    used = np.zeros(0, dtype=bool)
    vocabulary_size = len(tokenizer)
    check_name(html_path)
    fd, name = tempfile.mkstemp(dir=html_path.parent, prefix=f".{html_path.name}.", suffix=".part")  # O_EXCL | O_NOFOLLOW
    partial = Path(name)
    try:
        with tempfile.TemporaryFile(dir=html_path.parent) as blobs:
            try:
                for index, group in enumerate(read_groups(groups_path, limits, follow=follow)):
                    try:
                        row = summarise(index, group)
                        packed, id_arrays = pack_group(group)
                    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError) as err:  # not a group of this format
                        problems.append(f"group {index} (line {index + 1}) not shown: {type(err).__name__}: {err}")
                        logger.warning("%s: %s", console(str(groups_path)), console(problems[-1]))
                        continue
                    rows.append(row)
                    for ids in id_arrays:
                        ids = ids[ids < vocabulary_size]  # only ids the tokenizer has get a slot (the page shows the others as ⟨id⟩)
                        if ids.size:
                            top = int(ids.max())
                            if top >= used.size:
                                used = np.concatenate([used, np.zeros(max(top + 1 - used.size, used.size), dtype=bool)])
                            used[ids] = True
                    blobs.write(b'<script type="application/octet-stream" id="g%d">' % index + base64.b64encode(packed) + b"</script>\n")
            except RecordFileError as err:  # a line the reader refuses (the message names the file and line, escaped)
                if err.fatal:  # a decompression bomb, a line past the cap: no page
                    raise
                problems.append(f"reading stopped: {err}")
                logger.warning("%s; the viewer shows the groups before it", err)
            vocabulary = decode_vocabulary(tokenizer, np.flatnonzero(used))
            head, tail = _asset("page.html").split("{{groups}}")
            script = _asset("page.js")
            fill = {"title": html.escape(f"{groups_path.parent.name}/{groups_path.name}"), "style": _asset("page.css"), "script": script,
                    "script_hash": script_hash(script),
                    "vocabulary": script_json(vocabulary), "summary": script_json({"columns": COLUMNS, "rows": rows, "problems": problems})}
            # One pass, so a placeholder's text inside a filled-in value is left alone.
            head = re.sub(r"\{\{(\w+)\}\}", lambda m: fill[m.group(1)], head)
            with os.fdopen(fd, "wb") as out:
                fd = -1
                out.write(head.encode("utf-8"))
                blobs.seek(0)
                shutil.copyfileobj(blobs, out, 1 << 20)
                out.write(tail.encode("utf-8"))
        os.chmod(partial, 0o644)
        os.replace(partial, html_path)
    finally:
        if fd >= 0:
            os.close(fd)
        partial.unlink(missing_ok=True)
    logger.info("viewer of %d groups: %s (%.1f MB, %.1f s)", len(rows), html_path, html_path.stat().st_size / 1e6, time.perf_counter() - started)
    return html_path
