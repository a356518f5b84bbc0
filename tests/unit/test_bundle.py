"""Agent bundle and workdir archive: content-hashed, reproducible, excluding junk."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from mscon.console.bundle import agent_bundle, workdir_archive


def test_agent_bundle_is_complete_and_stable() -> None:
    a, b = agent_bundle(), agent_bundle()
    assert a.digest == b.digest and len(a.digest) == 16
    assert {"__main__.py", "protocol.py", "main.py"} <= set(a.files)


def test_workdir_archive_excludes_and_is_reproducible(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("y = 2\n")
    for junk in (".git", ".venv", "__pycache__", "mscon-runs"):
        (tmp_path / junk).mkdir()
        (tmp_path / junk / "f").write_text("junk")
    (tmp_path / "big.ckpt").write_text("weights")
    (tmp_path / "link.py").symlink_to("/etc/passwd")
    one = workdir_archive(tmp_path, ("*.ckpt",))
    two = workdir_archive(tmp_path, ("*.ckpt",))
    assert one.digest == two.digest and one.data == two.data
    names = tarfile.open(fileobj=io.BytesIO(one.data)).getnames()
    assert sorted(names) == ["pkg/m.py", "train.py"]
    (tmp_path / "train.py").write_text("x = 2\n")
    assert workdir_archive(tmp_path, ("*.ckpt",)).digest != one.digest
