""".ci/run passes make's verdict on (a failing or empty test run fails CI) and insists on promtool
and chromium (the browser tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.files import REPO_ROOT

CI_RUN = REPO_ROOT / ".ci" / "run"


def fake_tools(bin_dir: Path, *, make_rc: int, prometheus: bool, chromium: bool = True) -> None:
    """Stand-ins on PATH: `make` exits with ``make_rc``; apt-get fails (nothing is installed)."""
    bin_dir.mkdir()
    scripts = {"make": f"exit {make_rc}", "apt-get": "exit 100", "sudo": 'exec "$@"'}
    if prometheus:
        scripts |= {"promtool": "exit 0", "prometheus": "exit 0"}
    if chromium:
        scripts |= {"chromium": "exit 0"}
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    for name in ("dirname", "id"):  # the only external commands the script uses besides those
        real = shutil.which(name)
        assert real is not None
        (bin_dir / name).symlink_to(real)


def run_ci(bin_dir: Path) -> int:
    # PATH holds only the stand-ins: the real make, apt-get and promtool stay out of reach.
    bash = shutil.which("bash")
    assert bash is not None
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/")}
    return subprocess.run([bash, str(CI_RUN)], env=env, capture_output=True, timeout=60, check=False).returncode


@pytest.mark.parametrize(("make_rc", "expected"), [(0, 0), (1, 1), (5, 5)])
def test_ci_run_returns_the_test_verdict(tmp_path: Path, make_rc: int, expected: int) -> None:
    """make test exits 5 when pytest collected nothing: CI must fail then too."""
    fake_tools(tmp_path / "bin", make_rc=make_rc, prometheus=True)
    assert run_ci(tmp_path / "bin") == expected


def test_ci_run_fails_when_prometheus_cannot_be_installed(tmp_path: Path) -> None:
    fake_tools(tmp_path / "bin", make_rc=0, prometheus=False)
    assert run_ci(tmp_path / "bin") != 0


def test_ci_run_fails_when_chromium_cannot_be_installed(tmp_path: Path) -> None:
    fake_tools(tmp_path / "bin", make_rc=0, prometheus=True, chromium=False)
    assert run_ci(tmp_path / "bin") != 0
