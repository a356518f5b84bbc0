"""The built wheel: ``python -m mscon`` and ``mscon -V`` work from it, not only from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_python_dash_m_mscon_runs_from_the_built_wheel(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("mscon-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "mscon/__main__.py" in names and "mscon/console/cli/main.py" in names
        assert not any(n.startswith("mscon_main/") for n in names)
        zf.extractall(site)  # what an install puts in site-packages (as pip install --target does)
    # The wheel's tree comes first on the path, so mscon.* is imported from it, not from the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import mscon.console.cli.main as m; print(m.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(site), where
    version = wheel.name.split("-")[1]
    for flag in ("-V", "--version"):
        done = subprocess.run(
            [sys.executable, "-m", "mscon", flag],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, f"mscon {version}\n", "")
    shipped = site / "mscon" / "inventory" / "local.yaml"
    validated = subprocess.run(
        [sys.executable, "-m", "mscon", "validate", str(shipped)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert validated.returncode == 0 and "ok:" in validated.stdout, validated.stderr
