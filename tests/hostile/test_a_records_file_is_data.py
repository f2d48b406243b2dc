"""A records file is data, never script: the record check refuses mistyped fields, the viewer runs
no script of it, and values no run writes are shown or named (docs/guarantees.md, "Untrusted text")."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from experiments.bench.chromium import Chromium, chromium_binary
from opd.records.viewer import write_viewer

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- a records file is data, never script ----------------------------------------
# Every field a hostile file can fill reaches the page as text: the viewer escapes what it shows
# and its Content Security Policy runs only its own script. The record check refuses every group.


XSS = '<img src=x onerror="window.__pwned=(window.__pwned||0)+1"><script>window.__pwned=1</script>'


def _set(path: tuple, value: object):
    def edit(group: dict) -> None:
        target = group
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


# Each edit puts markup where a run writes a number, a list or a word.
HOSTILE_EDITS = {
    "score": _set(("scores", 0), XSS),
    "generated_tokens": _set(("overrides", 0, "generated_tokens"), XSS),
    "tools_used": _set(("overrides", 0, "tools_used"), {"length": XSS}),
    "tool_calls": _set(("overrides", 0, "tool_calls"), XSS),
    "tool_errors": _set(("overrides", 0, "tool_errors"), XSS),
    "finish_and_tests": lambda g: g["overrides"][0].update(finish=XSS, tests=XSS),
    "reward_signals": _set(("overrides", 0, "reward_signals"), {XSS: XSS}),
    "unknown_detail": _set(("overrides", 0, XSS), XSS),
    "turn_span": _set(("overrides", 0, "opd_turns", 0, "span"), [XSS, XSS]),
    "turn_message_index": _set(("overrides", 0, "opd_turns", 0, "message_index"), XSS),
    "turn_decision": _set(("overrides", 0, "opd_turns", 0, "decision"), XSS),
    "turn_votes": _set(("overrides", 0, "opd_turns", 0, "votes"), XSS),
    "turn_hint_and_error": lambda g: g["overrides"][0]["opd_turns"][0].update(hint=XSS, error=XSS, scored=XSS),
    "opd_turns": _set(("overrides", 0, "opd_turns"), XSS),
    "group_overrides": _set(("group_overrides",), {"item_id": XSS, XSS: XSS, "answer": [XSS]}),
    "generation_params": _set(("generation_params",), {XSS: {XSS: XSS}}),
    "message_role_and_content": _set(("messages", 0, 0), {"role": XSS, "content": {XSS: XSS}}),
    "message": _set(("messages", 0, 1), XSS),
    "messages": _set(("messages", 0), XSS),
}


def _hostile_records(tokenizer, path: Path) -> list[str]:
    from test_viewer import coding_group

    base = coding_group(tokenizer)
    names = sorted(HOSTILE_EDITS)
    with open(path, "w") as out:
        for name in names:
            group = copy.deepcopy(base)
            HOSTILE_EDITS[name](group)
            out.write(json.dumps(group) + "\n")
    return names


# Markup in a field that holds text, or under a key the format does not name, is a valid record:
# the viewer shows it as text.
WELL_TYPED = {"finish_and_tests", "unknown_detail"}


def test_the_record_check_refuses_every_field_of_the_wrong_type(tokenizer, tmp_path: Path) -> None:
    names = _hostile_records(tokenizer, tmp_path / "hostile.jsonl")
    from opd.records.__main__ import check_file

    count, problems = check_file(tmp_path / "hostile.jsonl")
    refused = {names[int(re.match(r"line \d+: group (\d+): ", p).group(1)) - 1] for p in problems}
    assert count == len(names) and refused == set(names) - WELL_TYPED, (set(names) - WELL_TYPED) ^ refused


@pytest.mark.browser
@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (scripts/install.sh installs it as root with apt)")
def test_a_hostile_records_file_runs_no_script_in_the_viewer(tokenizer, tmp_path: Path) -> None:
    names = _hostile_records(tokenizer, tmp_path / "hostile.jsonl")
    page = write_viewer(tmp_path / "hostile.jsonl", tokenizer, tmp_path / "hostile.html")
    with Chromium() as browser:
        # Installed before the page's own script (DevTools scripts are not subject to its policy).
        browser.send("Page.addScriptToEvaluateOnNewDocument", source=(
            "window.__violations = []; document.addEventListener('securitypolicyviolation', "
            "(e) => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sample || '')));"))
        browser.goto(page.as_uri())
        browser.wait_for("document.documentElement.dataset.indexMs")
        shown = browser.evaluate("[...document.querySelectorAll('#index-rows tr[data-g]')].map(tr => Number(tr.dataset.g))")
        assert len(shown) >= len(names) - 4, shown  # most groups are shown; the rest are named in the header
        for g in shown:
            browser.evaluate(f"(() => {{ document.querySelector('#index-rows tr[data-g=\"{g}\"]').click(); return true; }})()")
            browser.wait_for(f"document.querySelector('#detail h2') && document.querySelector('#detail h2').textContent.startsWith('group {g} ')")
            for r in range(browser.evaluate("document.querySelectorAll('.rollouts tr[data-r]').length")):
                browser.evaluate(f"(() => {{ document.querySelector('.rollouts tr[data-r=\"{r}\"]').click(); return true; }})()")
                browser.wait_for("!!document.getElementById('tokens')")
                browser.evaluate("(() => { const t = document.querySelector('#tokens .t.scored') || document.querySelector('#tokens .t'); t.click(); return true; })()")
        injected = browser.evaluate("document.querySelectorAll('img, iframe, object, embed, [onerror], [onload], #detail script, #index script').length")
        text = browser.evaluate("document.body.textContent")
        assert browser.evaluate("window.__pwned === undefined"), "a value of the file ran as script"
        assert injected == 0, "a value of the file became markup"
        assert browser.evaluate("window.__violations") == [], "markup reached the page (the policy stopped it)"
        assert XSS in text  # shown, as text
        assert browser.page_errors == [], browser.page_errors


def test_a_records_file_nested_too_deeply_is_a_clear_error(tmp_path: Path) -> None:
    from opd.records.__main__ import check_file

    path = tmp_path / "deep.jsonl"
    path.write_text('{"tokens": [[1]], "masks": [[1]], "scores": [0.0]}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    count, problems = check_file(path)
    assert count == 1 and problems == ["line 2: nested more than 64 deep"], problems


# Values no run writes, in a records file handed to the viewer: one NaN score made the whole page
# blank (the index's JSON said NaN, which JSON.parse refuses), a token id past 2^63 stopped the
# viewer with an OverflowError, and one token id of 2,000,000,000 made it allocate 15 GiB (a table
# slot per id up to the largest) until the kernel killed it.
OUT_OF_RANGE = {
    "score_nan": _set(("scores", 0), float("nan")),
    "score_infinite": _set(("scores", 1), float("inf")),
    "scores_overflowing_their_mean": _set(("scores",), [1e308, 1e308]),
    "tool_errors_infinite": _set(("overrides", 0, "tool_errors"), float("inf")),
    "detail_nan": _set(("overrides", 0, "generated_tokens"), float("nan")),
    "token_past_int64": lambda g: g["tokens"][0].__setitem__(0, 10**30),
    "token_negative": lambda g: g["tokens"][0].__setitem__(0, -5),
    "token_past_the_vocabulary": lambda g: g["tokens"][0].__setitem__(0, 5_000_000),
}


def _strict_json(text: str) -> object:
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are not JSON."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_values_out_of_range_are_shown_or_named_never_break_the_viewer(tokenizer, tmp_path: Path) -> None:
    from test_viewer import coding_group

    base = coding_group(tokenizer)
    path = tmp_path / "out_of_range.jsonl"
    with open(path, "w") as out:
        out.write(json.dumps(base) + "\n")
        for name in OUT_OF_RANGE:
            group = copy.deepcopy(base)
            OUT_OF_RANGE[name](group)
            out.write(json.dumps(group) + "\n")
    page = write_viewer(path, tokenizer, tmp_path / "out_of_range.html").read_text()
    parts = {m.group(1): m.group(2) for m in re.finditer(r'<script type="application/json" id="(\w+)">(.*?)</script>', page, re.S)}
    summary, vocabulary = _strict_json(parts["summary"]), _strict_json(parts["vocabulary"])
    assert len(vocabulary) <= len(tokenizer)  # a slot per id the tokenizer has, whatever ids the file holds
    shown = {row[0] for row in summary["rows"]}
    named = {int(p.split()[1]) for p in summary["problems"] if p.startswith("group ")}
    assert 0 in shown and shown | named == set(range(len(OUT_OF_RANGE) + 1)), (shown, summary["problems"])
    import base64
    import zlib

    for g in shown:  # each group the page can open has JSON its JSON.parse reads
        blob = re.search(rf'<script type="application/octet-stream" id="g{g}">([^<]*)</script>', page).group(1)
        data = zlib.decompress(base64.b64decode(blob))
        _strict_json(data[int.from_bytes(data[:4], "little"):].decode())
