"""Every benchmark runs the way the README calls it: ``python bench/<name>.py`` from the
repository root, not only as ``python -m bench.<name>`` (a script's own folder, not the root,
is first on ``sys.path``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the helpers (_common, live_server) are modules, not scripts
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def test_the_benchmarks_are_found() -> None:
    assert {"knn.py", "http_load.py", "soak.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
@pytest.mark.slow  # a Python process per script, most of them import torch
def test_a_benchmark_runs_as_a_script(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script.relative_to(ROOT)), "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
