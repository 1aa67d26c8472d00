"""`esp eval --quick`: the whole pipeline on a tiny random BERT and a data slice; report structure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from esp_retrieval.cli.main import main
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "eval.yaml"

pytestmark = pytest.mark.slow


def _quick_layout() -> SubspaceLayout:
    raw = yaml.safe_load(CONFIG.read_text())
    return SubspaceLayout.from_dims({o["name"]: o["dim"] for o in raw["quick"]["training"]["objectives"]})


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("eval")
    layout = _quick_layout()
    emb = normalize_blocks(np.random.default_rng(0).standard_normal((3, layout.dim)).astype(np.float32), layout)
    bundle = write_bundle(tmp / "bundle", layout, emb, ["a", "b", "c"], sections={"training": {"x": 1}})
    rc = main(["eval", "--quick", "--config", str(CONFIG), "--out", str(tmp / "reports"),
               "--work-dir", str(tmp / "work")])
    assert rc == 0
    return tmp / "reports", bundle


def test_report_has_every_section_and_method(quick_run: tuple[Path, Path]) -> None:
    out, _ = quick_run
    md = (out / "esp-bench.md").read_text()
    for section in ("## Protocol", "## Main table", "## Serving-weight sweep", "## Operating points",
                    "## Conflict proxy and effective rank", "## Training diagnostics", "## Keyword clustering"):
        assert section in md
    cfg = yaml.safe_load(CONFIG.read_text())
    for spec in cfg["methods"].values():
        assert f"| {spec['label']} |" in md
    assert "QUICK MODE" in md
    assert "| purity, clusters of 2+ | in singletons |" in md
    for png in ("pareto.png", "diagnostics.png", "clustering.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"({png})" in md


def test_results_json_is_consistent(quick_run: tuple[Path, Path]) -> None:
    out, _ = quick_run
    res = json.loads((out / "esp-bench.json").read_text())
    methods = yaml.safe_load(CONFIG.read_text())["methods"]
    assert set(res["methods"]) == set(methods)
    hybrids = {name for name, spec in methods.items() if "hybrid" in spec}
    assert hybrids, "the evaluation carries the BM25 + zero-shot anchor"
    for name, m in res["methods"].items():
        for row in m["per_seed"].values():
            assert 0.0 <= row["ndcg@10"] <= 1.0 and 0.0 <= row["entity_p@10"] <= 1.0
            assert row["n_queries"] == 8  # 4 per year in the quick slice, each scored once
            # stratified k-fold: every ORCAS-I query of the slice gets exactly one out-of-fold prediction
            # (a hybrid has no intent head)
            assert row["n_intent_predictions"] == (0 if name in hybrids else res["protocol"]["orcas_total"])
        assert all(h >= 0 for h in m["hypervolume"])
        if name in hybrids:
            continue
        for seed, curve in m["curves"].items():
            # simplex grid, step 0.5: 3 subspaces, or 4 with a sparse block
            assert len(curve) == (10 if "sparse" in methods[name] else 6)
            assert max(p["metrics"]["ndcg@10"] for p in curve) >= 0
            # the front's hypervolume covers every swept point (the default weights need not be on the grid)
            hv_best = max(p["metrics"]["ndcg@10"] * p["metrics"]["entity_p@10"] for p in curve)
            assert m["hypervolume"][m["seeds"].index(int(seed))] >= hv_best - 1e-12
    ops = res["operating_points"]
    assert set(ops) == {"semantic_first", "balanced", "entity_first"}
    sem = ops["semantic_first"]["metrics"]["ndcg@10"]
    ent = ops["entity_first"]["metrics"]["entity_p@10"]
    fm = yaml.safe_load(CONFIG.read_text())["front_method"]
    front = res["methods"][fm]["curves"]
    n_points = len(next(iter(front.values())))
    assert math.isclose(sem, max(np.mean([c[i]["metrics"]["ndcg@10"] for c in front.values()])
                                 for i in range(n_points)), abs_tol=1e-12)
    assert ent >= ops["semantic_first"]["metrics"]["entity_p@10"]
    # PCGrad acts where parameters are shared: the single-head heads, ESP's shared adapter
    for method in ("single_pcgrad_dwa", "esp_adapter_pcgrad_dwa"):
        assert 0.0 <= res["diagnostics"][method]["proj[semantic/entity]"] <= 1.0
    assert res["diagnostics"]["single_head"]["proj[semantic/entity]"] == 0.0  # no surgery, no projection
    # the query tower (query_top:N) is shared by the semantic and intent losses: PCGrad sees the pair
    tower = res["diagnostics"]["esp_query_tower_pcgrad_dwa"]
    assert 0.0 <= tower["proj[semantic/intent]"] <= 1.0 and -1.0 <= tower["cos[semantic/intent]"] <= 1.0
    assert res["diagnostics"]["esp_query_tower"]["proj[semantic/intent]"] == 0.0  # plain sum
    assert "proj[semantic/entity]" not in res["diagnostics"]["esp"]  # ESP shares nothing: no pairs
    rows = res["clustering"]["rows"]
    assert {r["setting"] for r in rows if r["method"] == fm} == set(res["clustering"]["settings"])
    for r in rows:  # groups of two or more are scored apart from singletons (pure by construction)
        o = r["orcas"]
        assert 0.0 <= o["singletons"] <= 1.0
        assert math.isnan(o["purity_multi"]) == (o["singletons"] + o["noise"] > 1.0 - 1e-9)


def test_hybrid_anchor_rows(quick_run: tuple[Path, Path]) -> None:
    """The min-max hybrid's front is its alpha sweep, its row the alpha chosen on the other year."""
    out, _ = quick_run
    res = json.loads((out / "esp-bench.json").read_text())
    mm = res["methods"]["hybrid_minmax"]
    (curve,) = mm["curves"].values()
    alphas = [p["weights"]["bm25"] for p in curve]
    assert alphas[0] == 0.0 and alphas[-1] == 1.0 and len(alphas) == 21
    assert all(math.isclose(p["weights"]["bm25"] + p["weights"]["dense"], 1.0) for p in curve)
    # alpha = 0 is the zero-shot trunk alone: the same rankings, the same metrics
    zs = res["methods"]["zero_shot"]["per_seed"]["None"]
    assert math.isclose(curve[0]["metrics"]["ndcg@10"], zs["ndcg@10"], abs_tol=1e-12)
    anchor = next(a for a in res["anchor"] if a["hybrid"] == "hybrid_minmax" and a["method"] == "esp_sparse")
    methods = yaml.safe_load(CONFIG.read_text())["methods"]
    sparse = {name for name, spec in methods.items() if "sparse" in spec}
    assert {a["method"] for a in res["anchor"]} == {"esp_sparse"} | sparse  # the front, and what has a sparse block
    assert set(anchor["alpha_used_on"]) == {"dl19", "dl20"}
    best = max(p["metrics"]["ndcg@10"] for p in curve)
    assert math.isclose(anchor["best"]["ndcg@10"], best, abs_tol=1e-12)
    assert "## The anchor: BM25 + zero-shot hybrids" in (out / "esp-bench.md").read_text()
    assert res["methods"]["hybrid_rrf"]["curves"] == {}


def test_sparse_block_joins_the_sweep(quick_run: tuple[Path, Path]) -> None:
    """A method with a sparse block sweeps it with the dense blocks (4 names, step 0.5: 10 points)."""
    out, _ = quick_run
    res = json.loads((out / "esp-bench.json").read_text())
    (curve,) = res["methods"]["esp_sparse"]["curves"].values()
    assert len(curve) == 10
    assert all(set(p["weights"]) == {"semantic", "entity", "intent", "bm25"} for p in curve)


def test_operating_points_with_a_sparse_block_are_not_written_into_a_bundle(
        quick_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The front's points weigh the sparse block, which this bundle does not carry: refused at
    once, naming it, and the bundle is left as it was."""
    out, bundle_path = quick_run
    before = read_bundle(bundle_path).operating_points
    rc = main(["eval", "--quick", "--config", str(CONFIG), "--out", str(out / "again"), "--bundle", str(bundle_path)])
    assert rc == 2
    assert "'bm25'" in capsys.readouterr().err
    assert read_bundle(bundle_path).operating_points == before
    assert not (out / "again").exists()


def test_every_lever_of_the_config_has_its_row(quick_run: tuple[Path, Path]) -> None:
    """The ``levers:`` of configs/eval.yaml each get a row: the two methods compared on the seeds
    both trained, with the difference the main table's per-seed numbers give."""
    out, _ = quick_run
    res = json.loads((out / "esp-bench.json").read_text())
    levers = yaml.safe_load(CONFIG.read_text())["levers"]
    assert [r["lever"] for r in res["levers"]] == list(levers)
    for r in res["levers"]:
        assert (r["method"], r["baseline"]) == (levers[r["lever"]]["method"], levers[r["lever"]]["baseline"])
        on, off = (res["methods"][m] for m in (r["method"], r["baseline"]))
        assert r["seeds"] == [0]  # quick mode trains seed 0 only
        assert math.isclose(r["hypervolume_diff"], on["hypervolume"][0] - off["hypervolume"][0], abs_tol=1e-12)
        assert r["verdict"].startswith(("helps", "hurts", "trade-off", "no significant effect"))
    md = (out / "esp-bench.md").read_text()
    assert "## Levers: each one on and off" in md and all(name in md for name in levers)
