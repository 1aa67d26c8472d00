"""``ESP_BACKEND=ivf``: the index in the bundle (``esp index --ann``), served live, refused when bad."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.live_server import start_server
from esp_retrieval.cli.main import main as esp
from esp_retrieval.service.config import Settings
from esp_retrieval.service.engine import create_engine
from esp_retrieval.service.engine.ann import ivf_options
from esp_retrieval.service.state import load_state
from esp_retrieval.subspace.bundle import BundleError, content_version, read_bundle, sha256_file
from esp_retrieval.subspace.engine.ivf import IvfBackend
from esp_retrieval.subspace.engine.ivf_index import IvfIndexError, add_index_to_bundle, bundle_index_dir
from tests.live_fixtures import SERVER_DEFAULTS


def _ivf_settings() -> Settings:
    return Settings(backend="ivf", threads=1)


def test_esp_index_ann_adds_a_checksummed_index_to_the_bundle(tiny_bundle_factory, capsys) -> None:
    path = tiny_bundle_factory("b")
    before = read_bundle(path).version
    assert esp(["index", "--ann", "--bundle", str(path), "--ann-nlist", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["build_seconds"] >= 0 and report["bytes"] > 0 and report["params"]["nlist"] == 4
    bundle = read_bundle(path)  # every file checked, the index's included
    assert bundle.version == report["version"] != before
    assert {"ann/ivf.json", "ann/p0.codes.npy"} <= set(bundle.manifest["files"])
    assert bundle.manifest["ann"]["kind"] == "ivf" and bundle_index_dir(path) is not None
    # a second run replaces the index (no stale files left behind)
    assert esp(["index", "--ann", "--bundle", str(path), "--ann-nlist", "2"]) == 0
    again = read_bundle(path)
    assert again.manifest["ann"]["params"]["nlist"] == 2
    assert esp(["index", "--bundle", str(path)]) == 2  # neither a corpus nor --ann
    assert "--corpus and --out are required" in capsys.readouterr().err


def test_the_served_ivf_engine_reads_the_bundle_index_and_matches_the_exact_one(tiny_bundle_factory) -> None:
    path = tiny_bundle_factory("b")
    add_index_to_bundle(path)
    bundle = read_bundle(path)
    options = {"ivf": functools.partial(ivf_options, bundle, 1.0)}
    engine = create_engine("ivf", bundle.embeddings, bundle.layout, threads=1, options=options)
    exact = create_engine("numpy", bundle.embeddings, bundle.layout, threads=1, options=options)
    assert isinstance(engine, IvfBackend) and engine.index.report["params"]["nlist"] >= 1
    assert engine.max_touched == 1.0
    rng = np.random.default_rng(0)
    q = bundle.embeddings[rng.choice(len(bundle.ids), 4, replace=False)]
    w = rng.uniform(0, 1, (4, len(bundle.layout)))
    a, b = engine.search(q, w, 5), exact.search(q, w, 5)
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_allclose(a.subspace_scores, b.subspace_scores, atol=1e-6)


def test_a_bad_index_refuses_the_bundle(tiny_bundle_factory) -> None:
    path = tiny_bundle_factory("b")
    add_index_to_bundle(path)
    codes = path / "ann" / "p0.codes.npy"
    raw = bytearray(codes.read_bytes())
    raw[-1] ^= 0x01
    codes.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"ann/p0\.codes\.npy: sha256 mismatch"):
        load_state(path, _ivf_settings())
    # an index whose files and manifest agree but that describes another corpus
    path = tiny_bundle_factory("c")
    add_index_to_bundle(path)
    meta_path = path / "ann" / "ivf.json"
    meta = json.loads(meta_path.read_text())
    meta["num_docs"] += 1
    meta_path.write_text(json.dumps(meta))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["ann/ivf.json"] = sha256_file(meta_path)
    manifest["version"] = content_version(manifest["files"])
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IvfIndexError, match=r"ivf\.json: built for \d+ rows, the corpus has \d+: rebuild"):
        load_state(path, _ivf_settings())


@pytest.mark.live  # two esp serve, started here
@pytest.mark.slow
def test_live_ivf_server_answers_like_the_exact_one(tiny_bundle_factory, tmp_path) -> None:
    path: Path = tiny_bundle_factory("b")
    add_index_to_bundle(path)
    servers = []
    try:  # generous start-up time: two servers load encoders on a shared machine
        for name, extra in (("ivf", {"backend": "ivf", "ann_max_touched": 1.0}), ("exact", {})):
            settings = {**SERVER_DEFAULTS, **extra}
            servers.append(start_server(path, tmp_path / f"{name}.log", settings=settings, ready_timeout=300))
        ivf, exact = servers
        body = {"queries": [{"text": "bank account"}, {"text": "river"}], "k": 3}
        a = httpx.post(f"{ivf.url}/v1/search", json=body, timeout=60)
        b = httpx.post(f"{exact.url}/v1/search", json=body, timeout=60)
        assert a.status_code == b.status_code == 200
        hits = [[(h["id"], round(h["score"], 5)) for h in r["hits"]] for r in a.json()["results"]]
        want = [[(h["id"], round(h["score"], 5)) for h in r["hits"]] for r in b.json()["results"]]
        assert hits == want
        assert "ivf index read from ann/" in ivf.log()
    finally:
        for server in servers:
            server.stop()
