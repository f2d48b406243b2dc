"""Characters that a terminal or a text viewer acts on instead of showing, escaped: in the JSONL a
run writes (`json_text`) and in what the record tools print (`console`).

A record's strings come from the policy and its tools. Written raw, U+009B (CSI in the C1 set) or
U+202E (right-to-left override) reach whoever runs `cat groups.jsonl` or opens it in an editor:
C1 controls start terminal escape sequences, bidi controls reorder the text shown around them.
JSON allows any character as a `\\uXXXX` escape, so escaping them changes no value read back.
"""

from __future__ import annotations

import re

# C0 controls (json escapes these itself; the console form needs them), DEL and the C1 set; the
# soft hyphen; the bidi controls (ALM, LRM, RLM, LRE..RLO, LRI..PDI); zero-width and invisible
# format characters; the line and paragraph separators (a line break to many readers); the BOM;
# interlinear annotation; lone surrogates (not UTF-8 at all: written raw they fail the encoding).
_UNSAFE = "\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff"
_JSON_UNSAFE = re.compile(f"[{_UNSAFE}]")
_CONSOLE_UNSAFE = re.compile(f"[\x00-\x1f{_UNSAFE}]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text(text: str) -> str:
    """JSON text (as `json.dumps(..., ensure_ascii=False)` writes it) with those characters as
    `\\uXXXX` escapes. Outside its strings JSON text is ASCII, so only string contents change,
    and only in spelling: the same values read back."""
    return _JSON_UNSAFE.sub(_escaped, text)


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def console(text: str) -> str:
    """`text` as one line that a terminal shows as it is: control, bidi and invisible characters
    (a newline too) as `\\xNN` / `\\uXXXX`."""
    return _CONSOLE_UNSAFE.sub(_shown, text)
