"""Hostile record files against the one reader of `python -m opd.records check`, `view` and
`resume=true` (`opd.records.reader`), and what the writer puts in a line.

- a gzip bomb (10 MB inflating to 10 GiB) is refused within seconds in bounded memory;
- check, view and resume take and refuse the same lines (deep nesting, a 5,000-digit number, a key
  twice, bytes that are not UTF-8, a line past the cap, gzip with garbage after it), each problem
  one line naming the file and the line;
- duplicate groups are flagged by check; resume keeps one of them, counted;
- C1, bidi and other invisible controls are escaped in the JSONL and read back unchanged;
- the console shows a file's text escaped.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from conftest import ROOT, compose
from helpers import make_group, sequence
from opd.records import LIMITS, GroupWriter, Limits, read_groups, recover
from opd.records.__main__ import check_file


def group(item: str = "m-1") -> dict:
    return make_group([sequence([1, 2], [3, 4], [-0.1, -2.0]), sequence([1, 2], [5], -0.5)], [1.0, -1.0],
                      overrides=[{"finish": "eos"}, {"finish": "eos"}], group_overrides={"item_id": item})


def line(value: dict) -> str:
    return json.dumps(value) + "\n"


# ---- a decompression bomb ------------------------------------------------------------------

GIB = 1 << 30
# Runs the command line in a process of its own, with a data limit that keeps the machine safe from
# a reader that inflates the whole file (it then fails with MemoryError), and says its peak memory
# (VmHWM: this program's own; ru_maxrss would carry over the forking pytest worker's).
RUNNER = """
import re, resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))
from opd.records.__main__ import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:  # an error that stops the command (opd.cli.fail) exits after its line
    code = stop.code
with open("/proc/self/status") as status:
    print("peak_kib", re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1), file=sys.stderr)
sys.exit(code)
"""


def gzip_bomb(path: Path, gib: int, fill: bytes) -> Path:
    """A gzip file that inflates to `gib` GiB of `fill`, made without writing them anywhere: one
    member of 64 MiB compressed once (~65 KB at level 9), written 16 times per GiB (a gzip file is
    any number of members, inflated one after another)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = compressor.compress(fill * (64 << 20)) + compressor.flush()
    with open(path, "wb") as out:
        for _ in range(gib * 16):
            out.write(member)
    return path


@pytest.mark.parametrize("fill", [b"\0", b"\n"], ids=["zeros", "newlines"])
@pytest.mark.parametrize("command", ["check", pytest.param("view", marks=pytest.mark.slow)])  # view imports transformers: ~15 s
def test_a_gzip_bomb_is_refused_within_seconds_in_bounded_memory(tmp_path: Path, command: str, fill: bytes) -> None:
    """Zeros are one endless line; newlines are endless blank lines (no line cap stops them)."""
    bomb = gzip_bomb(tmp_path / "groups.jsonl.gz", 10, fill)
    assert bomb.stat().st_size < 12_000_000
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", RUNNER, command, str(bomb), *(["--out", str(tmp_path / "page.html")] if command == "view" else [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    peak = int(re.search(r"peak_kib (\d+)", output).group(1)) * 1024 if "peak_kib" in output else None
    assert done.returncode == 1 and "Traceback" not in output, output[-2000:]
    errors = [text for text in output.splitlines() if "decompression bomb" in text]
    # check reports the file's line among its findings; view stops, in the one error style of every entry point.
    assert len(errors) == 1 and re.match(rf"{'error: ' if command == 'view' else ''}{re.escape(str(bomb))}: line \d+: inflates \d+ times its size",
                                         errors[0]), output[-2000:]
    # Bounded: the reader holds 16 MiB of inflated bytes at most (view also has transformers and a
    # tokenizer loaded, ~0.5 GiB); a reader that inflates the file whole needs 10 GiB.
    assert peak is not None and peak < (1 * GIB if command == "view" else 256 << 20), peak
    assert took < 120, took  # the command's start (view imports transformers) is most of it
    assert not (tmp_path / "page.html").exists()


# ---- check, view and resume read alike ------------------------------------------------------


def _deep(levels: int) -> str:
    """JSON text nested `levels` deep (as text: json.dumps itself recurses per level)."""
    return "[" * levels + '"v"' + "]" * levels


def _with(key: str, text: str) -> str:
    """A group's line whose first sequence's details hold `key` with the JSON text `text`."""
    return line(group("m-2")).replace('"overrides": [{', f'"overrides": [{{"{key}": {text}, ', 1)


# The second line of a file, each refused by the reader (the first and third are good groups):
# (line, what the reader says, the limits read with).
SMALL = Limits(max_line_bytes=4096)
HOSTILE_LINES = {
    "nested_985_deep": (_with("junk", _deep(985)), "nested more than 64 deep", LIMITS),
    "integer_of_5000_digits": (line(group("m-2"))[:-2] + ', "junk": ' + "7" * 5000 + "}\n", "a number of more than 4300 digits", LIMITS),
    "a_key_twice": (line(group("m-2"))[:-2] + ', "scores": [0.0, 0.0]}\n', 'the key "scores" appears twice in one object', LIMITS),
    "not_utf8": (line(group("m-2")).replace('"m-2"', '"m-\udcff"'), "not UTF-8", LIMITS),
    "past_the_line_cap": (_with("junk", '"' + "x" * 5000 + '"'), "a line longer than 4096 bytes", SMALL),
}


def _hostile_file(path: Path, name: str) -> Path:
    hostile = HOSTILE_LINES[name][0]
    data = line(group("m-1")) + hostile + line(group("m-3"))
    path.write_bytes(data.encode("utf-8", "surrogateescape"))
    return path


def _page_summary(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="summary">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


@pytest.mark.parametrize("name", list(HOSTILE_LINES))
def test_check_view_and_resume_refuse_the_same_lines_naming_file_and_line(tmp_path: Path, name: str, tokenizer) -> None:
    from opd.records import RecordFileError
    from opd.records.viewer import write_viewer

    path = _hostile_file(tmp_path / "groups.jsonl", name)
    _, why, limits = HOSTILE_LINES[name]
    count, problems = check_file(path, limits)
    assert any(p.startswith("line 2: ") and why in p for p in problems), problems
    with pytest.raises(RecordFileError, match=re.escape(f"{path}: line 2: {why}")):
        list(read_groups(path, limits))
    # view reads with the same reader: the page names the file and line and shows the group
    # before; a file it cannot read on (past the line cap) is no page.
    if limits is SMALL:
        with pytest.raises(RecordFileError, match=re.escape(f"{path}: line 2: {why}")):
            write_viewer(path, tokenizer, tmp_path / "page.html", limits)
    else:
        summary = _page_summary(write_viewer(path, tokenizer, tmp_path / "page.html", limits).read_text())
        assert [row[0] for row in summary["rows"]] == [0] and any(f"{path}: line 2: {why}" in p for p in summary["problems"]), summary["problems"]
    # resume: the file is cut there, one group kept, never an exception.
    recovered = recover(path, limits)
    assert [g["group_overrides"]["item_id"] for g in recovered.groups] == ["m-1"]
    assert path.read_text() == line(group("m-1")) and recovered.cut_because.startswith(f"{path}: line 2: ")


def test_the_default_limits_are_the_same_for_check_view_and_resume() -> None:
    import inspect

    from opd.records.viewer import write_viewer

    for reader in (check_file, write_viewer, recover, read_groups):
        assert inspect.signature(reader).parameters["limits"].default is LIMITS, reader


def test_gzip_with_garbage_after_it_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl.gz"
    path.write_bytes(gzip.compress(line(group()).encode()) + b"not gzip at all")
    count, problems = check_file(path)
    assert count == 1 and len(problems) == 1 and problems[0].startswith("line 2: not gzip data"), problems


# ---- duplicates -------------------------------------------------------------------------------


def _duplicates_file(path: Path) -> Path:
    first, other = group("m-1"), group("m-2")
    reordered = json.dumps(dict(reversed(list(first.items()))), indent=None, separators=(", ", " : "))  # same values, other spelling
    path.write_text(line(first) + line(first) + line(other) + line(first) + reordered + "\n")
    return path


def test_check_flags_duplicate_groups_and_duplicate_keys(tmp_path: Path) -> None:
    count, problems = check_file(_duplicates_file(tmp_path / "groups.jsonl"))
    assert count == 5
    assert problems == [f"line {n}: group {n}: a duplicate of the group on line 1" for n in (2, 4, 5)], problems
    keys = tmp_path / "keys.jsonl"
    keys.write_text(line(group())[:-2] + ', "tokens": [[1]]}\n')
    assert check_file(keys)[1] == ['line 1: the key "tokens" appears twice in one object']


def test_resume_keeps_one_of_duplicate_groups_counted_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from opd.experiment import resume_state

    out = tmp_path / "run"
    out.mkdir()
    path = _duplicates_file(out / "groups.jsonl")
    cfg = compose(["env=inline_math", "resume=true", f"output_dir={out}", "tracking.enabled=false", "total_steps=5"])
    with caplog.at_level(logging.INFO):
        resumed = resume_state(cfg, None, out)
    assert [g["group_overrides"]["item_id"] for g in resumed.groups] == ["m-1", "m-2"] and resumed.duplicates == 3
    assert path.read_text() == line(group("m-1")) + line(group("m-2"))  # the file holds each once, as written
    assert "3 duplicate groups dropped" in caplog.text and "line 2 repeats line 1" in caplog.text


# ---- what the writer puts in a line; what the console shows -----------------------------------

# C1 (U+0085 NEL, U+009B CSI), DEL, bidi (U+202E RLO, U+2066 LRI, U+061C ALM), the line
# separator, a zero-width joiner, the BOM and a lone surrogate.
CONTROLS = "\x7f\x85\x9b\u202e\u2066\u061c\u2028\u200d\ufeff\ud800"


def test_the_writer_escapes_c1_bidi_and_invisible_controls_and_reads_them_back(tmp_path: Path) -> None:
    hostile = group()
    hostile["messages"] = [[{"role": "tool", "content": f"out{CONTROLS}put"}], None]
    hostile["overrides"][0][f"key{CONTROLS}"] = [f"a{CONTROLS}b"]
    for path in (tmp_path / "groups.jsonl", tmp_path / "groups.jsonl.gz"):
        with GroupWriter(path) as writer:
            writer.write(hostile)
        raw = (gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()).decode("utf-8")
        assert raw.isascii(), sorted({f"U+{ord(c):04X}" for c in raw if not c.isascii()})
        assert "\\u009b" in raw and "\\u202e" in raw and "\\ud800" in raw
        assert list(read_groups(path)) == [hostile]


def test_check_prints_a_files_text_escaped(tmp_path: Path) -> None:
    hostile = group()
    hostile["overrides"][0]["reward_signals"] = {"\x1b]0;owned\x07\x1b[2J\u202eevil\x9b": "not a number"}
    path = tmp_path / "gro\x1bups.jsonl"
    path.write_text(line(hostile))
    done = subprocess.run([sys.executable, "-m", "opd.records", "check", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", output), repr(output)
    assert "reward_signals.\\x1b]0;owned\\x07\\x1b[2J\\u202eevil\\x9b must be a finite number" in output, output
    assert "gro\\x1bups.jsonl: line 1: group 1: " in output, output


def test_a_line_the_reader_would_refuse_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    deep = group()
    deep["overrides"][0]["junk"] = json.loads(_deep(80))
    with GroupWriter(path, limits=SMALL) as writer:
        writer.write(group())
        with pytest.raises(ValueError, match="nested more than 64 deep"):
            writer.write(deep)
        with pytest.raises(ValueError, match="longer than the reader's cap"):
            writer.write({**group(), "junk": "x" * 5000})
        writer.write(group("m-2"))
    assert [g["group_overrides"]["item_id"] for g in read_groups(path)] == ["m-1", "m-2"]


def test_a_failed_write_takes_its_partial_line_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opd.records import io as records_io

    path = tmp_path / "groups.jsonl"
    with GroupWriter(path) as writer:
        writer.write(group("m-1"))
        real = os.writev

        def full_disk(fd: int, buffers: list) -> int:
            real(fd, [bytes(buffers[0])[:7]])  # part of the line reaches the disk, then the disk is full
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(records_io.os, "writev", full_disk)
        with pytest.raises(OSError, match="No space"):
            writer.write(group("m-2"))
        monkeypatch.setattr(records_io.os, "writev", real)
        writer.write(group("m-3"))
    assert [g["group_overrides"]["item_id"] for g in read_groups(path)] == ["m-1", "m-3"]
    assert recover(path).cut_bytes == 0
