"""The distribution as pip builds it: one top-level package, ``esp_retrieval`` (docs/architecture.md,
section 2), so installing the project claims no generic name (``encoder``, ``service``, ...)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (path,) = out.glob("esp_retrieval-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" not in name}
    assert tops == {"esp_retrieval"}
    assert "esp_retrieval/cli/main.py" in wheel.namelist()
    assert not [n for n in wheel.namelist() if n.startswith(("esp_retrieval/bench/", "esp_retrieval/tests/"))]


def test_the_wheel_carries_the_page_and_the_command(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert {"esp_retrieval/service/ui/index.html", "esp_retrieval/service/ui/app.js"} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "esp = esp_retrieval.cli.main:main" in wheel.read(entry_points).decode()
