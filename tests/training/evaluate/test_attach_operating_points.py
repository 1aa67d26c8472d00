"""attach_operating_points: an exported ESP bundle gets points measured on its held-out year."""

from __future__ import annotations

from pathlib import Path

import pytest

from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.training.config import TrainConfig
from esp_retrieval.training.evaluate.config import DataSlice
from esp_retrieval.training.evaluate.operating_points import SEMANTIC_BUDGET, attach_operating_points
from esp_retrieval.training.evaluate.slice import make_data_slice

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[3] / "data"


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = DataSlice(queries_per_year=3, pool_per_query=10, orcas_per_class=4, mimics_parents=3)
    return make_data_slice(DATA, tmp_path_factory.mktemp("slice"), spec)


def _export(tmp: Path, data_dir: Path, architecture: str) -> tuple[Path, object, TrainConfig]:
    from esp_retrieval.training.evaluate.benchmark import load_dl
    from esp_retrieval.training.export import export_bundle
    from esp_retrieval.training.model import ESPModel, Trunk, TrunkMode
    from esp_retrieval.training.tiny import save_tiny_bert

    bench = load_dl(data_dir / "trec-dl-2019-2020-passage")
    tiny = save_tiny_bert(tmp / f"tiny-{architecture}", bench.texts)
    trunk = Trunk.from_pretrained(tiny, max_length=32, mode=TrunkMode.parse("frozen"))
    model = ESPModel(trunk, {"semantic": 8, "entity": 4, "intent": 4}, architecture=architecture)
    cfg = TrainConfig(
        data_dir=str(data_dir),
        objectives=[{"name": "semantic", "dim": 8, "data": "semantic", "loss": "info_nce"},
                    {"name": "entity", "dim": 4, "data": "entity", "loss": "info_nce"},
                    {"name": "intent", "dim": 4, "data": "intent", "loss": "cross_entropy"}],
        split={"by": "year", "heldout_year": "dl20"},
    )
    path = export_bundle(tmp / f"bundle-{architecture}", model, bench.pids, bench.texts, training={"k": "v"})
    return path, model, cfg


def test_points_written_for_an_esp_bundle(sliced: Path, tmp_path: Path) -> None:
    path, model, cfg = _export(tmp_path, sliced, "esp")
    points = attach_operating_points(path, model, cfg, step=0.5)
    b = read_bundle(path)  # checksums still valid after the rewrite
    assert set(points) == {"semantic_first", "balanced", "entity_first"}
    assert b.operating_points == points
    assert b.manifest["training"]["config"] == {"k": "v"}
    for p in points.values():
        assert set(p["weights"]) == {"semantic", "entity", "intent"}
        assert 0.0 <= p["metrics"]["ndcg@10"] <= 1.0 and 0.0 <= p["metrics"]["entity_p@10"] <= 1.0
        assert "held-out dl20" in p["description"]
    # semantic_first (the one-SE rule) stays within the 0.02 budget of every named point's NDCG@10
    best = max(p["metrics"]["ndcg@10"] for p in points.values())
    assert points["semantic_first"]["metrics"]["ndcg@10"] >= best - SEMANTIC_BUDGET - 1e-12


def test_a_bundles_sparse_block_is_swept_and_kept(sliced: Path, tmp_path: Path) -> None:
    from tests.live_fixtures import with_bm25

    dense, model, cfg = _export(tmp_path, sliced, "esp")
    path = with_bm25(dense, tmp_path / "bundle-bm25", weight=0.3)
    points = attach_operating_points(path, model, cfg, step=0.5)
    b = read_bundle(path)  # the rewrite kept the block, its files and its default weight
    assert list(b.sparse) == ["bm25"] and b.sparse_defaults == {"bm25": 0.3}
    assert b.operating_points == points
    for p in points.values():  # measured with the block in the sweep, not completed from its default
        assert set(p["weights"]) == {"semantic", "entity", "intent", "bm25"}
        assert sum(p["weights"].values()) == pytest.approx(1.0)


def test_single_head_bundle_is_left_alone(sliced: Path, tmp_path: Path) -> None:
    path, model, cfg = _export(tmp_path, sliced, "single_head")
    before = (path / "manifest.json").read_text()
    assert attach_operating_points(path, model, cfg) == {}
    assert (path / "manifest.json").read_text() == before
