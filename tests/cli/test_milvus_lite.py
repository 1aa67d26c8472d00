"""``esp milvus-lite``: one Milvus Lite file served over TCP; what it holds outlives the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.live_server import child_env, start_milvus_lite
from esp_retrieval.cli.main import main
from tests.cli.test_milvus_load import _bundle

pytest.importorskip("milvus_lite")

pytestmark = pytest.mark.live  # starts a server (esp milvus-lite) in a subprocess


def test_a_served_file_takes_a_load_refuses_a_second_server_and_keeps_its_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "shared.db"
    bundle = _bundle(tmp_path / "b", seed=4)
    with start_milvus_lite(db, tmp_path / "lite.log") as server:
        line = json.loads(next(ln for ln in server.log().splitlines() if '"uri"' in ln))
        assert line == {"uri": server.url, "db": str(db)}
        args = ["milvus-load", str(bundle), "--uri", server.url, "--collection", "c", "--no-progress"]
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == 250
        # the file is the server's: a second server on it does not start
        again = subprocess.run(
            [sys.executable, "-m", "esp_retrieval.cli", "milvus-lite", str(db), "--port", "1"],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=120,
            check=False,
        )
        assert again.returncode == 1 and "in use" in again.stderr
    assert server.proc.returncode == 0  # SIGTERM: a clean stop
    with start_milvus_lite(db, tmp_path / "lite2.log") as server:
        args = ["milvus-load", str(bundle), "--uri", server.url, "--collection", "c", "--no-progress"]
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out)["resumed_at"] == 250  # every row is still there
