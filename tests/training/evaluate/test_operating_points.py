"""Operating points: picked from the front, validated, and written into a bundle atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from esp_retrieval.subspace.weights import WeightError
from esp_retrieval.training.evaluate.operating_points import compute_operating_points, write_operating_points

LAYOUT = SubspaceLayout.from_dims({"semantic": 4, "entity": 2, "intent": 2})

CURVE = [
    {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0}, "metrics": {"ndcg@10": 0.70, "entity_p@10": 0.40}},
    {"weights": {"semantic": 0.7, "entity": 0.3, "intent": 0.0}, "metrics": {"ndcg@10": 0.68, "entity_p@10": 0.60}},
    {"weights": {"semantic": 0.5, "entity": 0.5, "intent": 0.0}, "metrics": {"ndcg@10": 0.60, "entity_p@10": 0.65}},
    {"weights": {"semantic": 0.0, "entity": 1.0, "intent": 0.0}, "metrics": {"ndcg@10": 0.30, "entity_p@10": 0.70}},
    # dominated by the second point
    {"weights": {"semantic": 0.4, "entity": 0.4, "intent": 0.2}, "metrics": {"ndcg@10": 0.50, "entity_p@10": 0.55}},
]


def test_named_points_on_the_front() -> None:
    pts = compute_operating_points(CURVE, LAYOUT, context="seed 0")
    assert set(pts) == {"semantic_first", "balanced", "entity_first"}
    assert pts["semantic_first"]["weights"] == {"semantic": 1.0, "entity": 0.0, "intent": 0.0}
    # entity_first: the highest entity score within 0.02 NDCG@10 of the front's best (0.70 -> 0.68)
    assert pts["entity_first"]["weights"] == {"semantic": 0.7, "entity": 0.3, "intent": 0.0}
    wide = compute_operating_points(CURVE, LAYOUT, semantic_budget=float("inf"))
    assert wide["entity_first"]["weights"] == {"semantic": 0.0, "entity": 1.0, "intent": 0.0}
    tight = compute_operating_points(CURVE, LAYOUT, semantic_budget=0.0)
    assert tight["entity_first"]["weights"] == tight["semantic_first"]["weights"]
    # Scaled over the front (x in [.3, .7], y in [.4, .7]): (.60, .65) -> (.75, .83), distance .30
    # to (1, 1); (.68, .60) -> (.95, .67), distance .34.
    assert pts["balanced"]["weights"] == {"semantic": 0.5, "entity": 0.5, "intent": 0.0}
    assert pts["balanced"]["metrics"] == {"ndcg@10": 0.60, "entity_p@10": 0.65}
    assert pts["balanced"]["description"].endswith("(seed 0)")


def test_semantic_first_takes_the_most_semantic_point_within_one_standard_error() -> None:
    # the best NDCG (0.705) leans on entity; pure semantic is 0.004 below it and also on the front
    curve = [
        {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0}, "metrics": {"ndcg@10": 0.701, "entity_p@10": 0.40}},
        {"weights": {"semantic": 0.6, "entity": 0.2, "intent": 0.2}, "metrics": {"ndcg@10": 0.705, "entity_p@10": 0.39}},
        {"weights": {"semantic": 0.7, "entity": 0.3, "intent": 0.0}, "metrics": {"ndcg@10": 0.690, "entity_p@10": 0.60}},
    ]
    assert compute_operating_points(curve, LAYOUT)["semantic_first"]["weights"]["semantic"] == 0.6  # no SE: the max
    with_se = [{**p, "metrics": {**p["metrics"], "ndcg@10_se": 0.03}} for p in curve]
    pts = compute_operating_points(with_se, LAYOUT)
    # within one SE (capped at the 0.02 budget): 0.705, 0.701 and 0.690 -> the largest semantic share
    assert pts["semantic_first"]["weights"] == {"semantic": 1.0, "entity": 0.0, "intent": 0.0}
    # a point off the front counts too: the choice is on the semantic axis alone
    dominated = [{**p, "metrics": {**p["metrics"], "entity_p@10": 0.3}} if p["weights"]["semantic"] == 1.0 else p
                 for p in with_se]
    assert compute_operating_points(dominated, LAYOUT)["semantic_first"]["weights"]["semantic"] == 1.0
    tight = [{**p, "metrics": {**p["metrics"], "ndcg@10_se": 0.001}} for p in curve]
    assert compute_operating_points(tight, LAYOUT)["semantic_first"]["weights"]["semantic"] == 0.6
    # a layout without the semantic block falls back to the plain maximum
    other = SubspaceLayout.from_dims({"text": 4, "entity": 2, "intent": 2})
    renamed = [{**p, "weights": {"text" if k == "semantic" else k: v for k, v in p["weights"].items()}} for p in with_se]
    assert compute_operating_points(renamed, other)["semantic_first"]["weights"]["text"] == 0.6


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="allowed"):
        compute_operating_points(CURVE, LAYOUT, names=["fastest"])
    bad = [{"weights": {"semantic": 1.0, "price": 1.0}, "metrics": {"ndcg@10": 1.0, "entity_p@10": 1.0}}]
    with pytest.raises(WeightError, match="price"):
        compute_operating_points(bad, LAYOUT)


def _bundle(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    emb = normalize_blocks(rng.standard_normal((5, LAYOUT.dim)).astype(np.float32), LAYOUT)
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "esp_encoder.json").write_text("{}")
    return write_bundle(
        tmp_path / "bundle", LAYOUT, emb, [f"d{i}" for i in range(5)],
        docs=[{"text": f"doc {i}"} for i in range(5)], encoder_dir=enc,
        sections={"training": {"config": {"seed": 3}}, "operating_points": {}},
    )


def test_write_into_bundle_keeps_everything_else(tmp_path: Path) -> None:
    path = _bundle(tmp_path)
    before = read_bundle(path, mmap=False)
    pts = compute_operating_points(CURVE, LAYOUT)
    write_operating_points(path, pts)
    after = read_bundle(path, mmap=False)  # checksums verified
    assert after.operating_points == pts
    assert after.manifest["training"] == {"config": {"seed": 3}}
    assert after.ids == before.ids
    np.testing.assert_array_equal(after.embeddings, before.embeddings)
    assert after.docs() == before.docs()
    assert after.encoder_dir is not None and (after.encoder_dir / "esp_encoder.json").read_text() == "{}"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle")]  # no temp left


def test_write_rejects_bad_weights_and_leaves_bundle_untouched(tmp_path: Path) -> None:
    path = _bundle(tmp_path)
    manifest = (path / "manifest.json").read_text()
    with pytest.raises(WeightError, match="operating_points.x.weights"):
        write_operating_points(path, {"x": {"weights": {"semantic": -1.0}, "description": "", "metrics": {}}})
    assert (path / "manifest.json").read_text() == manifest
