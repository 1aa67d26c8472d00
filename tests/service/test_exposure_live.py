"""The exposure log: one JSON record per search served by an experiment arm, joined with the
search responses by request id (live server writing a file), sampling by unit, hashing."""

from __future__ import annotations

import hashlib
import json
import logging
import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.live_server import LiveServer
from esp_retrieval.service.config import Settings
from esp_retrieval.service.exposure import ExposureLog, hashed_unit, unit_sampled
from tests.live_fixtures import vectors_only

SALT = "exp-salt"


def _vector(dim: int, seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(dim).tolist()


@pytest.fixture(scope="module")
def exposure_server(
    served_bundle: Path, registry_file: Path, module_server_factory: Callable[..., LiveServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[LiveServer, Path]:
    root = tmp_path_factory.mktemp("exposure")
    bundle = vectors_only(served_bundle, root / "bundle")  # no encoder: ready in seconds
    path = root / "logs" / "exposure.jsonl"
    server = module_server_factory(
        bundle, registry=registry_file, exposure_log="file", exposure_log_path=path,
        exposure_include_ids="true", exposure_salt=SALT,
    )
    return server, path


def test_records_parse_and_join_the_responses_by_request_id(exposure_server: tuple[LiveServer, Path]) -> None:
    server, path = exposure_server
    responses: dict[str, dict] = {}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(12):
            body = {"queries": [{"vector": _vector(32, i)}, {"vector": _vector(32, 100 + i)}], "k": 3,
                    "experiment": "ent", "unit_id": f"user-{i}"}
            headers = {"X-Request-ID": f"req-{i}"} if i % 2 else {}  # the caller's id, or one made
            r = client.post("/v1/search", json=body, headers=headers)
            assert r.status_code == 200, r.text
            responses[r.headers["x-request-id"]] = {**r.json(), "unit": f"user-{i}"}
        # not exposures: no experiment, or a bad request
        assert client.post("/v1/search", json={"queries": [{"vector": _vector(32, 1)}]}).status_code == 200
        assert client.post("/v1/search", json={"queries": [], "experiment": "ent"}).status_code == 422
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 12
    by_id = {rec["request_id"]: rec for rec in records}
    assert set(by_id) == set(responses)
    assert {f"req-{i}" for i in range(1, 12, 2)} <= set(by_id)
    arms = set()
    for request_id, resp in responses.items():
        rec = by_id[request_id]
        assert rec["experiment"] == resp["experiment"] == "ent"
        assert rec["arm"] == resp["arm"]
        assert rec["operating_point"] == resp["operating_point"]
        assert rec["bundle_version"] == resp["bundle_version"]
        assert (rec["k"], rec["queries"]) == (3, 2)
        assert rec["ids"] == [[h["id"] for h in r["hits"]] for r in resp["results"]]
        expected_unit = "sha256:" + hashlib.sha256(f"{SALT}:{resp['unit']}".encode()).hexdigest()
        assert rec["unit_id"] == expected_unit and rec["unit_id_hashed"] is True
        assert rec["latency_ms"] >= 0 and rec["time"].endswith("+00:00")
        arms.add(rec["arm"])
    assert arms == {"control", "treatment"}  # 12 units land in both arms


def test_sampling_keeps_or_drops_whole_units(capsys: pytest.CaptureFixture[str]) -> None:
    units = [f"u{i}" for i in range(2000)]
    kept = [u for u in units if unit_sampled(u, 0.25)]
    assert 400 < len(kept) < 600  # about a quarter, decided by the unit alone
    assert kept == [u for u in units if unit_sampled(u, 0.25)]
    assert all(unit_sampled(u, 0.5) for u in kept)  # a larger rate keeps every unit a smaller one kept
    log = ExposureLog.from_settings(Settings(exposure_log="stdout", exposure_sample_rate=0.25,
                                             exposure_hash_unit_id=False))
    try:
        for u in units[:40]:
            log.record(experiment="e", arm="a", unit_id=u, operating_point=None, bundle_version="v",
                       k=1, queries=1, latency_seconds=0.001)
    finally:
        log.close()
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["unit_id"] for x in lines] == [u for u in units[:40] if unit_sampled(u, 0.25)]
    assert all(x["unit_id_hashed"] is False and "ids" not in x for x in lines)


def test_off_by_default_and_file_needs_a_path() -> None:
    assert not ExposureLog.from_settings(Settings()).enabled
    with pytest.raises(ValueError, match="exposure_log_path"):
        ExposureLog.from_settings(Settings(exposure_log="file"))


def _hashed(settings: Settings, unit: str = "user-42") -> str:
    log = ExposureLog.from_settings(settings)
    try:
        rec = log.record(experiment="e", arm="a", unit_id=unit, operating_point=None, bundle_version="v",
                         k=1, queries=1, latency_seconds=0.001)
    finally:
        log.close()
    assert rec is not None
    return str(rec["unit_id"])


def test_without_a_salt_a_random_one_is_generated_at_the_first_start_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty salt would let anyone recover a unit id from a record: ``sha256(":" + guess)``."""
    settings = Settings(exposure_log="file", exposure_log_path=tmp_path / "logs" / "exposure.jsonl")
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.exposure"):
        first = _hashed(settings)
    assert first != hashed_unit("user-42", "")
    salt_file = tmp_path / "logs" / "exposure.jsonl.salt"
    assert first == hashed_unit("user-42", salt_file.read_text().strip())
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    assert "ESP_EXPOSURE_SALT is not set" in caplog.text and "generated now" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.exposure"):
        assert _hashed(settings) == first  # the next start keeps it: records still join by unit
    assert "kept in" in caplog.text and "generated" not in caplog.text
    own = tmp_path / "salt"
    assert _hashed(Settings(exposure_log="stdout", exposure_salt_file=own)) == hashed_unit(
        "user-42", own.read_text().strip()
    )


def test_stdout_without_a_salt_file_hashes_with_a_salt_of_the_process(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.exposure"):
        one, two = _hashed(Settings(exposure_log="stdout")), _hashed(Settings(exposure_log="stdout"))
    assert hashed_unit("user-42", "") not in (one, two) and one != two
    assert "hashes change at every start" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="esp_retrieval.service.exposure"):
        assert _hashed(Settings(exposure_log="stdout", exposure_salt=SALT)) == hashed_unit("user-42", SALT)
    # a set salt: nothing to warn about (the exposure records themselves are INFO lines of their own
    # logger, captured too when an earlier test left the root logger at INFO)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    capsys.readouterr()
