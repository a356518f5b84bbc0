"""Where the run's TLS key goes while OpenSSL reads it (agent/tls.py, used by the console too):
an anonymous in-memory file, never a named file in a temp folder that a kill would leave behind;
the fallback without memfd is a private folder whose failed removal is said (issue 45)."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mscon.agent import tls
from mscon.console.transport.link_tls import make_run_tls

RUN = make_run_tls()


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TMPDIR (and tempfile's cached choice) pointing at a folder the test watches; HOME too."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return folder


def test_the_key_is_read_from_memory_not_a_named_file(
    shared_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ssl.SSLContext.load_cert_chain
    seen: list[tuple[str, str, list[str]]] = []

    def watching(ctx: ssl.SSLContext, certfile: str, *args: object, **kwargs: object) -> None:
        # What the path is, and everything on disk, while OpenSSL reads.
        seen.append((certfile, os.readlink(certfile), _files_under(tmp_path)))
        real(ctx, certfile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", watching)
    old = os.umask(0)  # whatever the umask
    try:
        tls.server_context(RUN.cert, RUN.key)
        tls.client_context(RUN.cert, RUN.key)
        with pytest.raises(ssl.SSLError):  # a key OpenSSL refuses: its error, nothing left either
            tls.client_context(RUN.cert, "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
    finally:
        os.umask(old)
    assert len(seen) == 3
    for path, target, on_disk in seen:
        assert path.startswith("/proc/self/fd/") and target.startswith("/memfd:mscon-tls"), target
        assert on_disk == []
    assert _files_under(tmp_path) == []


def test_a_kill_while_the_key_is_read_leaves_no_key_behind(tmp_path: Path) -> None:
    """The process dies inside load_cert_chain (between writing the key and removing it, for a
    file): nothing holding the key is left under $TMPDIR or HOME."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    child = textwrap.dedent(
        """
        import os, signal, ssl, sys
        from mscon.agent import tls
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        ssl.SSLContext.load_cert_chain = die
        tls.server_context(sys.argv[1], sys.argv[2])
        """
    )
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp)}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", child, RUN.cert, RUN.key], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    left = [p for p in tmp_path.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]
    assert left == []


def test_without_memfd_a_private_folder_removed_after(
    shared_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    real = ssl.SSLContext.load_cert_chain
    seen: list[str] = []

    def watching(ctx: ssl.SSLContext, certfile: str, *args: object, **kwargs: object) -> None:
        seen.append(certfile)
        folder = Path(certfile).parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(Path(certfile).stat().st_mode) == 0o600
        real(ctx, certfile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", watching)
    tls.client_context(RUN.cert, RUN.key)
    base = tmp_path / "home" / ".cache" / "mscon"
    assert Path(seen[0]).parent.parent == base  # not $TMPDIR
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert _files_under(tmp_path) == [] and list(base.iterdir()) == []


def test_without_memfd_a_failed_removal_is_said_and_never_hides_the_first_error(
    shared_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    real_unlink = os.unlink

    def refuse(path: str, *args: object, **kwargs: object) -> None:
        if str(path).endswith("run.pem"):
            raise PermissionError(13, "Permission denied")
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    # All else went well: the failed removal is the error.
    said = r"could not remove the run's TLS key file: .*run\.pem \(Permission denied\)"
    with pytest.raises(OSError, match=said):
        tls.client_context(RUN.cert, RUN.key)
    # OpenSSL refused the key first: that error goes on, the removal's is written to stderr.
    with pytest.raises(ssl.SSLError):
        tls.client_context(RUN.cert, "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----")
    err = capfd.readouterr().err
    assert err.count("could not remove the run's TLS key file") == 1 and "\n" == err[-1]
    for left in (tmp_path / "home" / ".cache" / "mscon").rglob("run.pem"):
        real_unlink(left)  # what the refused unlink left, so tmp_path can go
