"""``esp serve`` fails fast, with the reason, before starting a server it could not feed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ESP_")}
    return subprocess.run(
        [sys.executable, "-m", "esp_retrieval.cli", "serve", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def test_missing_bundle_directory_exits_1_naming_the_manifest(tmp_path: Path) -> None:
    out = _serve("--bundle", str(tmp_path / "nope"))
    assert out.returncode == 1
    assert "invalid bundle" in out.stderr and "manifest.json" in out.stderr


def test_no_bundle_at_all_exits_2() -> None:
    out = _serve()
    assert out.returncode == 2
    assert "--bundle" in out.stderr


def test_invalid_setting_exits_2(tmp_path: Path) -> None:
    out = _serve("--bundle", str(tmp_path), "--max-batch", "0")
    assert out.returncode == 2
    assert "max_batch" in out.stderr
