"""Atomic outputs: a failed write leaves neither a partial file nor a temporary one."""

import pytest

from fluidopt.core.files import atomic_path


def test_atomic_path_renames_on_success(tmp_path):
    target = tmp_path / "table.csv"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".csv" and tmp.parent == tmp_path
        tmp.write_text("a,b\n1,2\n")
        assert not target.exists()  # nothing visible until the write completed
    assert target.read_text() == "a,b\n1,2\n"
    assert list(tmp_path.iterdir()) == [target]


def test_atomic_path_keeps_the_old_file_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "figure.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted mid-write")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]
