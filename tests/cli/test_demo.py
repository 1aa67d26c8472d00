"""``make demo``'s printed part: both requests run, the lists are shown, the curl commands work."""

from __future__ import annotations

import io
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from bench.live_server import LiveServer
from esp_retrieval.cli.demo import find_bundle, main, weight_vectors
from esp_retrieval.service.schemas import LayoutResponse, SubspaceInfo


def test_find_bundle_accepts_the_bundle_or_a_folder_above_it(tmp_path: Path) -> None:
    bundle = tmp_path / "artifacts" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    assert find_bundle(bundle) == bundle
    assert find_bundle(tmp_path / "artifacts") == bundle
    with pytest.raises(FileNotFoundError):
        find_bundle(tmp_path / "artifacts" / "bundle" / "nothing-here")


def test_demo_without_a_bundle_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--artifacts", str(tmp_path)]) == 1
    assert "no bundle" in capsys.readouterr().err


def test_weight_vectors_favour_semantic_then_entity() -> None:
    layout = LayoutResponse(
        dim=8,
        subspaces=[
            SubspaceInfo(name=n, dim=d, offset=o, loss="info_nce", default_weight=1.0)
            for n, d, o in (("semantic", 4, 0), ("entity", 2, 4), ("intent", 2, 6))
        ],
        default_weights={"semantic": 1.0, "entity": 1.0, "intent": 1.0},
        bundle_version="v",
    )
    vectors = weight_vectors(layout)
    assert vectors == {
        "semantic-heavy": {"semantic": 1.0, "entity": 0.1, "intent": 0.1},
        "entity-heavy": {"semantic": 0.1, "entity": 1.0, "intent": 0.1},
    }


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_printed_requests_work_and_match_the_lists(served: LiveServer) -> None:
    from esp_retrieval.cli.demo import show

    out = io.StringIO()
    results = show(served.url, "what is the capital of france", k=5, out=out)
    text = out.getvalue()
    assert "semantic-heavy" in text and "entity-heavy" in text
    curls = [line for line in text.splitlines() if line.startswith("curl ")]
    assert len(curls) == 2
    for command, expected in zip(curls, results, strict=True):
        answer = json.loads(
            subprocess.run(shlex.split(command), capture_output=True, check=True, text=True).stdout
        )
        assert [h["id"] for h in answer["results"][0]["hits"]] == [h.id for h in expected.results[0].hits]
        for hit in expected.results[0].hits:
            assert hit.id in text  # the side-by-side table lists every hit
    # beside the curls, the playground page's URL, which the server serves
    assert f"{served.url}/ui" in text.splitlines()
    page = httpx.get(f"{served.url}/ui", timeout=30)
    assert page.status_code == 200 and "<title>ESP playground</title>" in page.text
