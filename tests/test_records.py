"""Record checks and the flushed JSONL writer."""

from __future__ import annotations

import json

import numpy as np

from opd.records import MASK, MASKED_LOGPROB, GroupWriter, check_group, read_groups


def good_group() -> dict:
    return {
        "tokens": [[1, 2, 3, 4], [1, 2, 5]],
        "masks": [[MASK, MASK, 3, 4], [MASK, MASK, 5]],
        "scores": [1.0, -1.0],
        "inference_logprobs": [[MASKED_LOGPROB, MASKED_LOGPROB, -0.1, -2.0], [MASKED_LOGPROB, MASKED_LOGPROB, -0.5]],
    }


def test_good_group_has_no_problems() -> None:
    assert check_group(good_group()) == []


def test_each_misalignment_is_reported() -> None:
    cases = {
        "masks[1] has 2 entries": lambda g: g["masks"][1].pop(),
        "inference_logprobs[0] has 3 entries": lambda g: g["inference_logprobs"][0].pop(),
        "scores must have one entry per sequence": lambda g: g["scores"].pop(),
        "is neither -100 nor the token id": lambda g: g["masks"][0].__setitem__(2, 7),
        "on a generated token": lambda g: g["inference_logprobs"][0].__setitem__(3, 0.5),
        "on a masked position": lambda g: g["inference_logprobs"][0].__setitem__(0, -0.3),
        "not a finite number": lambda g: g["scores"].__setitem__(0, float("nan")),
        "masks every position": lambda g: g["masks"].__setitem__(1, [MASK, MASK, MASK]),
    }
    for expected, breaks in cases.items():
        group = good_group()
        breaks(group)
        problems = check_group(group)
        assert any(expected in p for p in problems), (expected, problems)


def test_writer_flushes_each_group_and_handles_numpy(tmp_path) -> None:
    path = tmp_path / "groups.jsonl"
    writer = GroupWriter(path)
    group = good_group()
    group["scores"] = np.array([1.0, -1.0])
    writer.write(group)
    # Readable before close: a killed process loses nothing already written.
    assert json.loads(path.read_text().splitlines()[0])["scores"] == [1.0, -1.0]
    writer.write(good_group())
    writer.close()
    assert len(list(read_groups(path))) == 2


def test_validate_cli_reports_bad_files(tmp_path) -> None:
    from opd.validate import main

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(good_group()) + "\n")
    assert main([str(path)]) == 0
    bad = good_group()
    bad["masks"][0].pop()
    path.write_text(json.dumps(good_group()) + "\n" + json.dumps(bad) + "\n" + '{"tokens": [[1,')
    assert main([str(path)]) == 1


def test_gzip_records_read_back_and_validate_even_without_their_trailer(tmp_path) -> None:
    import shutil

    from opd.validate import validate_file

    plain, packed = tmp_path / "g.jsonl", tmp_path / "g.jsonl.gz"
    groups = [good_group() for _ in range(3)]
    with GroupWriter(plain) as a, GroupWriter(packed) as b:
        for group in groups:
            a.write(group)
            b.write(group)
        # What a SIGKILL leaves: the file as flushed so far, no gzip trailer.
        shutil.copy(packed, tmp_path / "killed.jsonl.gz")
    assert list(read_groups(packed)) == list(read_groups(plain)) == groups
    assert list(read_groups(tmp_path / "killed.jsonl.gz")) == groups
    assert validate_file(packed) == (3, []) and validate_file(tmp_path / "killed.jsonl.gz") == (3, [])
    with GroupWriter(packed) as again:  # appending adds a gzip member
        again.write(groups[0])
    assert len(list(read_groups(packed))) == 4
