"""The records viewer: the index rows, the packed groups, the command, and the page in a real
headless Chromium (clicks on the index, a rollout, a scored token and its top-K)."""

from __future__ import annotations

import base64
import gzip
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from experiments.bench.chromium import Chromium, chromium_binary
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, Sequence, check_group
from opd.records.viewer import write_viewer
from opd.records.viewer.summary import COLUMNS, summarise

K = 4
HINT = "Run the tests before you answer."
CALL = '<tool_call>\n{"name": "terminal", "arguments": {"command": "python test_solution.py"}}\n</tool_call>'


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def student_logprobs(n: int, start: int) -> list[float]:
    return [round(-0.25 - 0.5 * ((start + i) % 5), 3) for i in range(n)]


def coding_group(tokenizer) -> dict[str, Any]:
    """opd_coding, two rollouts: rollout 0's first turn is hinted and scored (K teacher entries per
    token, one token the teacher likes more than the student, the next less); its second turn is
    hinted but its scoring failed (pads); rollout 1's first turn is judged -1 without a hint."""
    eos = tokenizer.eos_token_id
    messages = [{"role": "system", "content": "You are a careful Python programmer."},
                {"role": "user", "content": "Write add(a, b) in solution.py. <b>bold</b> stays text."}]
    prompt = ids(tokenizer, tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    tool_text = "ok: 3 passed"
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [], "distill_token_ids": [], "distill_logprobs": [],
                             "overrides": [], "messages": [], "advantages": None, "ref_logprobs": None,
                             "generation_params": {"temperature": 1.0}, "group_overrides": {"item_id": "coding-7</script><b id=pwn>x</b>", "opd_wall_s": 0.5}}
    for r in range(2):
        seq = Sequence.from_prompt(prompt)
        turn1 = ids(tokenizer, CALL) + [eos]
        start1 = len(seq.tokens)
        seq.add_generated(turn1, student_logprobs(len(turn1), 4))
        seq.add_inserted(ids(tokenizer, f"\n<|im_start|>user\n<tool_response>\n{tool_text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"))
        answer = ids(tokenizer, "All tests pass.") + [eos]
        start2 = len(seq.tokens)
        seq.add_generated(answer, student_logprobs(len(answer), 3))
        n = len(seq.tokens)
        row_ids = [[DISTILL_PAD_ID] * K for _ in range(n)]
        row_lps = [[DISTILL_PAD_LOGPROB] * K for _ in range(n)]
        teacher: list[float | None] = [None] * n
        if r == 0:
            for offset, p in enumerate(range(start1, start1 + len(turn1))):
                sampled = seq.tokens[p]
                lp = round(seq.logprobs[p] + (1.5 if offset == 0 else -2.0 if offset == 1 else -0.5), 3)
                others = [(round(-3.0 - 0.7 * j, 3), (sampled + 17 * (j + 1)) % 4000 + 10) for j in range(K - 1)]
                entries = sorted([(lp, sampled), *others], reverse=True)
                row_ids[p] = [i for _, i in entries]
                row_lps[p] = [x for x, _ in entries]
                teacher[p] = lp
            turns = [{"span": [start1, start1 + len(turn1)], "message_index": 2,
                      "next_state_role": "tool", "votes": [1, 1, -1], "decision": 1, "hint": HINT, "scored": True, "error": None}]
        else:
            turns = [{"span": [start1, start1 + len(turn1)], "message_index": 2, "next_state_role": "tool", "votes": [1, -1, None],
                      "decision": 1, "hint": "Read the error first.", "scored": False, "error": "HTTPError: 500 from the teacher"}]
        group["tokens"].append(seq.tokens)
        group["masks"].append(seq.masks)
        group["inference_logprobs"].append(seq.logprobs)
        group["distill_token_ids"].append(row_ids)
        group["distill_logprobs"].append(row_lps)
        group["scores"].append([0.97, 0.12][r])
        group["messages"].append([*messages, {"role": "assistant", "content": CALL}, {"role": "tool", "content": tool_text},
                                  {"role": "assistant", "content": "All tests pass."}])
        group["overrides"].append({
            "reward_signals": {"correctness": [1.0, 0.0][r], "efficiency": 0.9, "tool_usage": 1.0}, "tests": ["pass", "fail"][r],
            "turns": 2, "tools_used": ["terminal"], "tool_errors": r, "finish": "answer", "generated_tokens": len(turn1) + len(answer),
            "opd_turns": turns, "teacher_logprobs": teacher,
        })
    assert check_group(group) == []
    return group


def math_group(tokenizer) -> dict[str, Any]:
    """inline_math, two rollouts: rollout 0 calls the calculator and the environment inserts its
    response into the turn (masked, after the first sampled token); rollout 1 violates the format."""
    prompt = ids(tokenizer, "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n")
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [], "overrides": [], "messages": None,
                             "advantages": None, "ref_logprobs": None, "generation_params": {"temperature": 1.0},
                             "group_overrides": {"item_id": "math-3", "answer": "42"}}
    for r in range(2):
        seq = Sequence.from_prompt(prompt)
        think = ids(tokenizer, '<think>I will compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>')
        seq.add_generated(think, student_logprobs(len(think), 1))
        if r == 0:
            seq.add_inserted(ids(tokenizer, "<tool_response>\n42\n</tool_response>"))
        tail = ids(tokenizer, "</think>\\boxed{42}" if r == 0 else "\\boxed{41}") + [tokenizer.eos_token_id]
        seq.add_generated(tail, student_logprobs(len(tail), 2))
        group["tokens"].append(seq.tokens)
        group["masks"].append(seq.masks)
        group["inference_logprobs"].append(seq.logprobs)
        group["scores"].append([1.2, -3.0][r])
        group["overrides"].append({"reward_signals": {"correct": [1.0, 0.0][r], "incorrect": [0.0, 1.0][r], "tool_use": [1.0, 0.0][r],
                                                      "format_violation": [0.0, 1.0][r]},
                                   "correct": r == 0, "tool_calls": 1 - r, "tool_errors": 0, "finish": "eos", "generated_tokens": len(think) + len(tail)})
    assert check_group(group) == []
    return group


@pytest.fixture
def records(tmp_path, tokenizer) -> Path:
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(coding_group(tokenizer)) + "\n" + json.dumps(math_group(tokenizer)) + "\n")
    return path


def unpack(blob: bytes) -> dict[str, Any]:
    """A packed group read back as the page reads it (opd/records/viewer/page.js `unpack`)."""
    raw = zlib.decompress(blob)
    (meta_at,) = struct.unpack_from("<I", raw)
    meta = json.loads(raw[meta_at:])
    for seq in meta["sequences"]:
        seq["a"] = {}
        for name, (kind, at, n) in seq["arrays"].items():
            dtype = np.dtype("<" + kind)
            planes = np.frombuffer(raw, dtype=np.uint8, count=n * dtype.itemsize, offset=at).reshape(dtype.itemsize, n)
            seq["a"][name] = planes.T.copy().view(dtype).reshape(-1)
    return meta


def page_blobs(html: str) -> dict[int, bytes]:
    found = re.findall(r'<script type="application/octet-stream" id="g(\d+)">([^<]*)</script>', html)
    return {int(g): base64.b64decode(data) for g, data in found}


# ---- without a browser ----------------------------------------------------------------------


def test_index_rows_count_what_each_env_records(tokenizer) -> None:
    coding = dict(zip(COLUMNS, summarise(0, coding_group(tokenizer))))
    math = dict(zip(COLUMNS, summarise(1, math_group(tokenizer))))
    assert (coding["env"], coding["passed"], coding["failed"], coding["hinted_turns"], coding["scored_turns"]) == ("opd_coding", 1, 1, 2, 1)
    assert (coding["tool_calls"], coding["tool_errors"], coding["format_violations"]) == (2, 1, 0)
    assert coding["score_mean"] == pytest.approx(0.545) and coding["score_std"] == pytest.approx(0.425)
    assert (math["env"], math["passed"], math["failed"], math["hinted_turns"], math["format_violations"], math["tool_calls"]) == ("inline_math", 1, 1, 0, 1, 1)


def test_a_group_says_its_environment_and_each_rollout_whether_it_passed() -> None:
    """The viewer reads what the records say (any environment, also one it was never written
    for), and falls back to the record's shape only for records that do not say."""
    group = {"tokens": [[1, 2], [1, 3]], "masks": [[-100, 2], [-100, 3]], "scores": [1.0, 0.0],
             "group_overrides": {"env": "echo", "item_id": "e1"},
             "overrides": [{"passed": True, "tool_calls": 2}, {"passed": False, "tool_calls": 0}]}
    row = dict(zip(COLUMNS, summarise(0, group)))
    assert (row["env"], row["passed"], row["failed"], row["tool_calls"]) == ("echo", 1, 1, 2)
    legacy = {**group, "group_overrides": {"item_id": "e1", "answer": "5"}, "overrides": [{"correct": True}, {"correct": False}]}
    row = dict(zip(COLUMNS, summarise(0, legacy)))
    assert (row["env"], row["passed"], row["failed"]) == ("inline_math", 1, 1)


def test_the_page_holds_each_group_packed_as_the_record_says(records, tokenizer, tmp_path) -> None:
    html_path = write_viewer(records, tokenizer, tmp_path / "groups.html")
    html = html_path.read_text()
    groups = [coding_group(tokenizer), math_group(tokenizer)]
    blobs = page_blobs(html)
    assert sorted(blobs) == [0, 1]
    coding = unpack(blobs[0])
    seq = coding["sequences"][0]
    a = seq["a"]
    record = groups[0]
    assert a["tokens"].tolist() == record["tokens"][0]
    generated = [p for p, m in enumerate(record["masks"][0]) if m != MASK]
    runs = a["generated"].reshape(-1, 2)
    assert [p for start, end in runs for p in range(start, end)] == generated
    assert np.allclose(a["student"] / 1000, [record["inference_logprobs"][0][p] for p in generated], atol=5e-4)
    teacher_at = [p for p, t in enumerate(record["overrides"][0]["teacher_logprobs"]) if t is not None]
    assert a["rows"].tolist() == teacher_at and a["row_sizes"].tolist() == [K] * len(teacher_at)
    assert a["row_ids"].tolist() == [i for p in teacher_at for i in record["distill_token_ids"][0][p]]
    assert np.allclose(a["row_logprobs"] / 100, [x for p in teacher_at for x in record["distill_logprobs"][0][p]], atol=5e-3)
    assert np.allclose(a["teacher"] / 1000, [record["overrides"][0]["teacher_logprobs"][p] for p in teacher_at], atol=5e-4)
    assert DISTILL_PAD_ID not in a["row_ids"].tolist() and a["row_logprobs"].min() > -1e6
    assert seq["details"]["opd_turns"][0]["hint"] == HINT and "teacher_logprobs" not in seq["details"]
    # Rollout 1 has no teacher row: nothing kept, pads included.
    assert coding["sequences"][1]["a"]["rows"].size == 0 and coding["sequences"][1]["a"]["row_ids"].size == 0
    assert unpack(blobs[1])["group_overrides"]["answer"] == "42"
    # Every id shown is decoded once in the vocabulary table, by the tokenizer.
    vocabulary = json.loads(re.search(r'<script type="application/json" id="vocabulary">(.*?)</script>', html, re.S).group(1))
    for i in set(record["tokens"][0]) | set(a["row_ids"].tolist()):
        assert vocabulary[i] == tokenizer.decode([i], skip_special_tokens=False)
    # Self-contained: nothing is fetched (no external script, style, font or image).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(""", html)
    # The item id with markup in it cannot end the summary's script element.
    assert "coding-7</script>" not in html


def test_view_command_writes_next_to_the_file_also_from_gzip(records, tmp_path) -> None:
    from opd.records.__main__ import main

    assert main(["view", str(records)]) == 0
    assert len(page_blobs((tmp_path / "groups.html").read_text())) == 2
    packed = tmp_path / "packed.jsonl.gz"
    packed.write_bytes(gzip.compress(records.read_bytes()))
    out = tmp_path / "elsewhere" / "view.html"
    out.parent.mkdir()
    assert main(["view", str(packed), "--out", str(out)]) == 0
    assert len(page_blobs(out.read_text())) == 2
    assert main(["view", str(packed)]) == 0 and (tmp_path / "packed.html").exists()
    with pytest.raises(SystemExit) as stopped:  # a missing input: one line, status 2, before any work
        main(["view", str(tmp_path / "missing.jsonl")])
    assert stopped.value.code == 2


def test_a_cut_file_or_a_foreign_group_is_named_and_the_rest_shown(records, tokenizer, tmp_path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"tokens": "not a list"}\n' + records.read_text() + '{"tokens": [[1,\n')
    html = write_viewer(broken, tokenizer, tmp_path / "broken.html").read_text()
    assert sorted(page_blobs(html)) == [1, 2]
    summary = json.loads(re.search(r'<script type="application/json" id="summary">(.*?)</script>', html, re.S).group(1))
    assert [row[0] for row in summary["rows"]] == [1, 2]
    assert len(summary["problems"]) == 2 and summary["problems"][0].startswith("group 0 (line 1) not shown")
    assert "broken.jsonl: line 4: not a JSON line" in summary["problems"][1]
    assert not (tmp_path / "broken.html.part").exists()


# ---- in Chromium ------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (scripts/install.sh installs it as root with apt)")

INDEX_ROWS = "[...document.querySelectorAll('#index-rows tr[data-g]')].map(tr => [Number(tr.dataset.g), tr.children[1].textContent])"


def click(selector: str) -> str:
    """A script that runs the element's click handlers (an error if it is not there)."""
    return f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) throw new Error('no ' + {json.dumps(selector)}); el.click(); return true; }})()"


def choose(select_id: str, value: str) -> str:
    return f"(() => {{ const s = document.getElementById('{select_id}'); s.value = '{value}'; s.dispatchEvent(new Event('change')); return true; }})()"


def popup_rows(browser: Chromium) -> list[list[str]]:
    return browser.evaluate("[...document.querySelectorAll('#popup tbody tr')].map(tr => [...tr.children].map(td => td.textContent).concat([tr.className]))")


@pytest.mark.browser
@needs_chromium
def test_the_page_in_chromium_index_rollout_tokens_and_top_k(records, tokenizer, tmp_path) -> None:
    html_path = write_viewer(records, tokenizer, tmp_path / "groups.html")
    coding = coding_group(tokenizer)
    with Chromium() as browser:
        browser.goto(html_path.as_uri())
        browser.wait_for("document.documentElement.dataset.indexMs")
        assert browser.evaluate(INDEX_ROWS) == [[0, coding["group_overrides"]["item_id"]], [1, "math-3"]]
        assert browser.evaluate("document.getElementById('pwn')") is None  # the item id is text, not markup
        assert "2 groups · 4 rollouts" in browser.evaluate("document.getElementById('totals').textContent")

        # Filters and sorting, by the page's own handlers.
        for value, expected in (("hints", [0]), ("format", [1]), ("failed", [0, 1]), ("all", [0, 1])):
            browser.evaluate(choose("filter", value))
            assert [g for g, _ in browser.evaluate(INDEX_ROWS)] == expected, value
        browser.evaluate(click("th[data-sort=score_mean]"))
        assert [g for g, _ in browser.evaluate(INDEX_ROWS)] == [1, 0]  # -0.9 before 0.545
        browser.evaluate(click("th[data-sort=score_mean]"))
        assert [g for g, _ in browser.evaluate(INDEX_ROWS)] == [0, 1]

        # Open the coding group, then rollout 0.
        browser.evaluate(click("#index-rows tr[data-g='0']"))
        browser.wait_for("document.querySelectorAll('.rollouts tr[data-r]').length === 2")
        browser.evaluate(click(".rollouts tr[data-r='0']"))
        browser.wait_for("!!document.getElementById('tokens')")
        assert browser.evaluate("location.hash") == "#g=0&r=0"
        turns_text = browser.evaluate("document.querySelector('table.turns').textContent")
        assert HINT in turns_text and "[1,1,-1]" in turns_text
        conversation = browser.evaluate("[...document.querySelectorAll('.msg')].map(m => [m.className, m.querySelector('pre').textContent, (m.querySelector('.judge .hint') || {}).textContent || ''])")
        assert [c[0] for c in conversation] == ["msg system", "msg user", "msg assistant", "msg tool", "msg assistant"]
        assert "<b>bold</b>" in conversation[1][1] and conversation[3][1] == "ok: 3 passed" and HINT in conversation[2][2]

        # A scored token: coloured by A = teacher - student, the numbers in its title.
        details = coding["overrides"][0]
        scored = [p for p, t in enumerate(details["teacher_logprobs"]) if t is not None]
        liked, disliked = scored[0], scored[1]
        for p, colour in ((liked, "rgba(20, 150, 60"), (disliked, "rgba(200, 30, 30")):
            span = browser.evaluate(f"(() => {{ const s = document.querySelector('#tokens .t[data-p=\"{p}\"]'); return [s.className, s.style.background, s.title]; }})()")
            teacher, student = details["teacher_logprobs"][p], coding["inference_logprobs"][0][p]
            assert "scored" in span[0] and span[1].startswith(colour), span
            assert f"teacher {teacher:.3f} · student {student:.3f} · A {'+' if teacher >= student else '−'}{abs(teacher - student):.3f}" in span[2]
        assert browser.evaluate("document.querySelectorAll('#tokens .t.scored').length") == len(scored)

        # Click it: the teacher's top-K, decoded, the sampled token marked, no pads.
        browser.evaluate(click(f"#tokens .t[data-p='{liked}']"))
        assert browser.evaluate("!document.getElementById('popup').hidden")
        rows = popup_rows(browser)
        expected = list(zip(coding["distill_token_ids"][0][liked], coding["distill_logprobs"][0][liked]))
        assert [(int(r[2]), float(r[3])) for r in rows] == [(i, pytest.approx(lp, abs=5e-3)) for i, lp in expected]
        assert [r[1] for r in rows] == [tokenizer.decode([i]).replace(" ", "·").replace("\n", "↵") or "∅" for i, _ in expected]
        assert [r[2] for r in rows if r[5] == "sampled"] == [str(coding["tokens"][0][liked])]
        assert browser.evaluate("location.hash") == f"#g=0&r=0&p={liked}"

        # A generated token of the unscored turn, a prompt token, an inserted tool response.
        masks, answer_at = coding["masks"][0], max(p for p, m in enumerate(coding["masks"][0]) if m != MASK)
        browser.evaluate(click(f"#tokens .t[data-p='{answer_at}']"))
        assert "No teacher row" in browser.evaluate("document.getElementById('popup').textContent") and popup_rows(browser) == []
        first = masks.index(next(m for m in masks if m != MASK))
        kinds = browser.evaluate("[...document.querySelectorAll('#tokens .t')].map(s => s.classList[1])")
        expected_kinds = ["prompt" if p < first else "generated" if m != MASK else "inserted" for p, m in enumerate(masks)]
        assert kinds == expected_kinds
        inserted_at = expected_kinds.index("inserted")
        assert "inserted, not sampled" in browser.evaluate(f"document.querySelector('#tokens .t[data-p=\"{inserted_at}\"]').title")

        # The inline_math group: its tool response inside the turn is marked as inserted.
        browser.evaluate(click("#index-rows tr[data-g='1']"))
        browser.wait_for("document.querySelectorAll('.rollouts tr[data-r]').length === 2")
        browser.evaluate(click(".rollouts tr[data-r='0']"))
        browser.wait_for("!!document.getElementById('tokens')")
        math = math_group(tokenizer)
        inserted = browser.evaluate("[...document.querySelectorAll('#tokens .t.inserted')].map(s => s.textContent).join('')")
        assert inserted == "<tool_response>↵\n42↵\n</tool_response>"
        facts = browser.evaluate("document.querySelector('#rollout .kv').textContent")
        assert "signal: format_violation0" in facts and "finisheos" in facts and "tool calls1" in facts
        assert browser.evaluate("document.querySelectorAll('#tokens .t.scored').length") == 0
        assert len(math["tokens"][0]) == browser.evaluate("document.querySelectorAll('#tokens .t').length")
        assert browser.page_errors == []


@pytest.mark.browser
@needs_chromium
def test_a_link_opens_the_group_rollout_and_token_it_names(records, tokenizer, tmp_path) -> None:
    html_path = write_viewer(records, tokenizer, tmp_path / "groups.html")
    position = next(p for p, t in enumerate(coding_group(tokenizer)["overrides"][0]["teacher_logprobs"]) if t is not None)
    with Chromium() as browser:
        browser.goto(f"{html_path.as_uri()}#g=0&r=0&p={position}")
        browser.wait_for("!document.getElementById('popup').hidden")
        assert browser.evaluate("document.getElementById('popup').dataset.p") == str(position)
        assert len(popup_rows(browser)) == K
        assert browser.evaluate("document.querySelector('#index-rows tr.open').dataset.g") == "0"
        assert browser.page_errors == []


OPD_CONTROLS = """(() => ({
    filter: [...document.querySelectorAll('#filter option')].map(o => o.value),
    headings: [...document.querySelectorAll('#index-head th')].map(th => th.dataset.sort),
    totals: document.getElementById('totals').textContent,
    help: document.getElementById('help').textContent,
}))()"""
GROUP_CONTROLS = """(() => ({
    rollout_headings: [...document.querySelectorAll('.rollouts th')].map(th => th.textContent),
    tokens_heading: [...document.querySelectorAll('#rollout h3')].map(h => h.textContent).find(t => t.startsWith('Tokens')),
    legend: document.querySelector('#rollout .legend').textContent,
}))()"""


def open_rollout(browser, g: int) -> dict[str, Any]:
    browser.evaluate(click(f"#index-rows tr[data-g='{g}']"))
    browser.wait_for("document.querySelectorAll('.rollouts tr[data-r]').length === 2")
    browser.evaluate(click(".rollouts tr[data-r='0']"))
    browser.wait_for("!!document.getElementById('tokens')")
    return browser.evaluate(GROUP_CONTROLS)


@pytest.mark.browser
@needs_chromium
def test_opd_controls_show_only_where_a_group_has_opd_data(records, tokenizer, tmp_path) -> None:
    """An inline_math page has no hints, teachers or advantages to show: no such controls. On a
    page with both envs the OPD controls stay for the opd_coding group and leave the other."""
    math_only = tmp_path / "math.jsonl"
    math_only.write_text(json.dumps(math_group(tokenizer)) + "\n" + json.dumps(math_group(tokenizer)) + "\n")
    with Chromium() as browser:
        browser.goto(write_viewer(math_only, tokenizer, tmp_path / "math.html").as_uri())
        browser.wait_for("document.documentElement.dataset.indexMs")
        page = browser.evaluate(OPD_CONTROLS)
        assert "hints" not in page["filter"] and "hinted_turns" not in page["headings"], page
        assert "hinted" not in page["totals"] and "teacher" not in page["help"], page
        group = open_rollout(browser, 0)
        assert "hinted/judged turns" not in group["rollout_headings"] and "teacher" not in group["tokens_heading"], group
        assert "A = teacher" not in group["legend"]
        browser.evaluate(click("#tokens .t.generated"))
        assert "teacher" not in browser.evaluate("document.getElementById('popup').textContent")
        assert browser.page_errors == []

        browser.goto(write_viewer(records, tokenizer, tmp_path / "both.html").as_uri())
        browser.wait_for("document.documentElement.dataset.indexMs")
        page = browser.evaluate(OPD_CONTROLS)
        assert "hints" in page["filter"] and "hinted_turns" in page["headings"] and "2 hinted turns" in page["totals"], page
        hints = browser.evaluate("[...document.querySelectorAll('#index-rows tr')].map(tr => tr.children[7].textContent)")
        assert hints == ["2", "–"]  # the inline_math group has no OPD data: a dash, not a count
        coding = open_rollout(browser, 0)
        assert "hinted/judged turns" in coding["rollout_headings"] and "with a teacher row" in coding["tokens_heading"]
        assert "A = teacher" in coding["legend"]
        math = open_rollout(browser, 1)
        assert "hinted/judged turns" not in math["rollout_headings"] and "A = teacher" not in math["legend"], math
        assert browser.page_errors == []


ROLLOUT_PASSED = ("(() => { const dt = [...document.querySelectorAll('#rollout dl.kv dt')].find(d => d.textContent === 'passed'); "
                  "return dt ? dt.nextElementSibling.textContent : null; })()")


@pytest.mark.browser
@needs_chromium
def test_the_rollout_pane_says_passed_as_the_record_says_for_any_environment(tokenizer, tmp_path) -> None:
    """The record's `passed` (its rubric's verdict) is what the rollout pane shows: for an
    environment the viewer was never written for, and for opd_coding where the tests failed an
    assertion the rubric credits enough to pass."""
    echo = math_group(tokenizer)
    echo["group_overrides"] = {"env": "echo", "item_id": "echo-1"}
    for r, detail in enumerate(echo["overrides"]):
        del detail["correct"]
        detail["passed"] = r == 0
    coding = coding_group(tokenizer)
    for detail in coding["overrides"]:
        detail["tests"], detail["passed"] = "assertion", True
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(echo) + "\n" + json.dumps(coding) + "\n")
    with Chromium() as browser:
        browser.goto(write_viewer(path, tokenizer, tmp_path / "groups.html").as_uri())
        browser.wait_for("document.documentElement.dataset.indexMs")
        for g in (0, 1):
            open_rollout(browser, g)
            assert browser.evaluate(ROLLOUT_PASSED) == "yes", g
        assert browser.page_errors == []
