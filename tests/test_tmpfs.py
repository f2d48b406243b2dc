"""The tmpfs of a call directory: its caps hold, statvfs counts it, unmounting frees it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opd.jail import tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not tmpfs.available(), reason="mounting a tmpfs needs a root launcher")


def test_the_caps_hold_and_usage_says_what_it_holds(tmp_path: Path) -> None:
    where = tmp_path / "call"
    where.mkdir()
    tmpfs.mount(where, tmpfs.Quota(1, 20), 201_234)
    try:
        assert (where.stat().st_uid, where.stat().st_mode & 0o777) == (201_234, 0o700)
        assert tmpfs.usage(where) == tmpfs.Usage(0, 1024 * 1024, 0, 20)
        with pytest.raises(OSError, match="No space left"):
            (where / "big").write_bytes(b"0" * (2 * 1024 * 1024))
        assert tmpfs.usage(where).full and tmpfs.full_words(where, tmpfs.Quota(1, 20), "it is") == "it is full (quota: 1 MiB)"
        (where / "big").unlink()
        made = 0
        with pytest.raises(OSError, match="No space left"):
            for made in range(100):
                (where / f"f{made}").touch()
        assert made == 20 and tmpfs.full_words(where, tmpfs.Quota(1, 20), "it is") == "it is full (quota: 20 files)"
        assert tmpfs.mounts_under(tmp_path) == [where]
    finally:
        tmpfs.unmount(where)
    assert tmpfs.mounts_under(tmp_path) == [] and list(where.iterdir()) == []


def test_every_mount_below_a_directory_is_unmounted_deepest_first(tmp_path: Path) -> None:
    outer, inner = tmp_path / "a b", tmp_path / "a b" / "c"  # a space: mountinfo escapes it
    outer.mkdir()
    tmpfs.mount(outer, tmpfs.Quota(1, 16), None)
    inner.mkdir()
    tmpfs.mount(inner, tmpfs.Quota(1, 16), None)
    assert tmpfs.mounts_under(tmp_path) == [inner, outer]
    assert tmpfs.unmount_all_under(tmp_path)
    assert tmpfs.mounts_under(tmp_path) == []
