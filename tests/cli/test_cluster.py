"""``esp cluster`` end to end on the tiny bundle (real encoder, random weights), plus an optional
check on the trained demo bundle."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from esp_retrieval.cli.main import main
from tests.conftest import TINY_INTENT_CLASSES

COLUMNS = ["keyword", "cluster_id", "cluster_label", "intent", "intent_probability", "similarity_to_label"]
KEYWORDS = [
    "cheap rice cooker",
    "buy rice cooker online",
    "how does a rice cooker work",
    "Cheap  Rice Cooker",  # duplicate of line 1 after case/space folding
    "",
    "weather in paris",
    "paris weather tomorrow",
    "facebook login",
]
DISTINCT = [k for i, k in enumerate(KEYWORDS) if k and i != 3]


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _run(tmp_path: Path, bundle: Path, *extra: str, text: str | None = None, name: str = "kw.txt") -> int:
    inp = tmp_path / name
    if text is not None:
        inp.write_text(text, encoding="utf-8")
    return main(
        ["cluster", "--bundle", str(bundle), "--input", str(inp), "--out", str(tmp_path / "out.csv"), *extra]
    )


def test_txt_input_every_distinct_keyword_once(tmp_path: Path, tiny_bundle: Path) -> None:
    assert _run(tmp_path, tiny_bundle, "--threshold", "0.05", text="\n".join(KEYWORDS) + "\n") == 0
    rows = _read(tmp_path / "out.csv")
    assert list(rows[0]) == COLUMNS
    assert sorted(r["keyword"] for r in rows) == sorted(DISTINCT)  # duplicate merged, blank skipped
    ids = [int(r["cluster_id"]) for r in rows]
    assert ids == sorted(ids)  # written cluster by cluster
    by_cluster: dict[int, list[dict[str, str]]] = {}
    for r in rows:
        by_cluster.setdefault(int(r["cluster_id"]), []).append(r)
        assert r["intent"] in TINY_INTENT_CLASSES
        assert 0.0 <= float(r["intent_probability"]) <= 1.0
    for members in by_cluster.values():
        labels = {r["cluster_label"] for r in members}
        assert len(labels) == 1
        (label,) = labels
        label_row = next(r for r in members if r["keyword"] == label)  # the label is a member
        assert float(label_row["similarity_to_label"]) == pytest.approx(1.0)
        assert all(float(r["similarity_to_label"]) <= 1.0 for r in members)


def test_csv_keyword_column_and_truth_scores(tmp_path: Path, tiny_bundle: Path, capsys) -> None:
    text = "id,keyword,topic\n1,rice cooker price,rice\n2,Rice Cooker Price,rice\n3,paris weather,paris\n"
    code = _run(tmp_path, tiny_bundle, "--truth", "topic", text=text, name="kw.csv")
    assert code == 0
    rows = _read(tmp_path / "out.csv")
    assert sorted((r["keyword"], r["truth"]) for r in rows) == [
        ("paris weather", "paris"),
        ("rice cooker price", "rice"),
    ]
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["keywords"] == 2
    assert {"purity", "nmi", "ari", "n_clusters", "noise"} <= set(scores)


def test_tsv_first_column_or_named_column(tmp_path: Path, tiny_bundle: Path) -> None:
    text = "query\tother\nalpha one\tx\nbeta two\ty\n"
    assert _run(tmp_path, tiny_bundle, text=text, name="kw.tsv") == 0
    assert sorted(r["keyword"] for r in _read(tmp_path / "out.csv")) == ["alpha one", "beta two"]
    assert _run(tmp_path, tiny_bundle, "--column", "other", name="kw.tsv") == 0
    assert sorted(r["keyword"] for r in _read(tmp_path / "out.csv")) == ["x", "y"]


def test_hdbscan_noise_is_reported_not_dropped(tmp_path: Path, tiny_bundle: Path) -> None:
    # fewer keywords than min_cluster_size: every one is noise, and every one is still written
    code = _run(
        tmp_path,
        tiny_bundle,
        "--method",
        "hdbscan",
        "--min-cluster-size",
        "10",
        "--operating-point",
        "entity_heavy",
        text="\n".join(DISTINCT),
    )
    assert code == 0
    rows = _read(tmp_path / "out.csv")
    assert sorted(r["keyword"] for r in rows) == sorted(DISTINCT)
    assert {(r["cluster_id"], r["cluster_label"], r["similarity_to_label"]) for r in rows} == {("-1", "", "")}


@pytest.mark.parametrize(
    ("extra", "text", "name", "message"),
    [
        ((), "", "kw.txt", "has no keywords"),
        ((), "\n  \n\n", "kw.txt", "has no keywords"),
        ((), "", "kw.csv", "is empty"),
        ((), "keyword\n", "kw.csv", "has no keywords"),
        ((), "a\n", "kw.json", "must end in one of"),
        (("--column", "nope"), "keyword\na\n", "kw.csv", "'nope' is not a column"),
        (("--weights", "topic=1"), "a\n", "kw.txt", "valid names: ['semantic', 'entity', 'intent']"),
        (("--weights", "semantic:1"), "a\n", "kw.txt", "--weights must look like"),
        (("--weights", "semantic=-1"), "a\n", "kw.txt", "must be >= 0"),
        (("--operating-point", "nope"), "a\n", "kw.txt", "available: ['balanced', 'entity_heavy']"),
        (
            ("--method", "hdbscan", "--threshold", "0.3"),
            "a\n",
            "kw.txt",
            "not a parameter of method 'hdbscan'",
        ),
        (("--threshold", "5"), "a\n", "kw.txt", "threshold must be a number in [0.0, 2.0]"),
        (("--param", "linkage=ward"), "a\n", "kw.txt", "linkage must be one of"),
        (("--batch-size", "0"), "a\n", "kw.txt", "--batch-size must be >= 1"),
    ],
)
def test_bad_input_gets_a_clear_error(tmp_path, tiny_bundle, capsys, extra, text, name, message) -> None:  # noqa: PLR0917
    assert _run(tmp_path, tiny_bundle, *extra, text=text, name=name) == 2
    err = capsys.readouterr().err
    assert "esp cluster: error:" in err and message in err
    assert not (tmp_path / "out.csv").exists()


def test_weights_and_operating_point_are_exclusive(tmp_path: Path, tiny_bundle: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, tiny_bundle, "--weights", "semantic=1", "--operating-point", "balanced", text="a\n")
    assert exc.value.code == 2


DEMO = Path(__file__).resolve().parents[2] / "artifacts" / "demo" / "bundle"  # where `make demo` exports
DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.slow
@pytest.mark.skipif(
    not (DEMO / "manifest.json").exists(), reason="artifacts/demo/bundle absent (built by `make demo`)"
)
def test_demo_bundle_intent_weight_splits_topics_by_intent() -> None:
    """On the trained demo bundle and shipped keywords: semantic-only weights keep MIMICS
    refinements of one query together better than intent-heavy weights do, and intent-heavy
    clusters are (nearly) pure in the intent the head predicts, more so than semantic-only ones."""
    from esp_retrieval.encoder.query_encoder import QueryEncoder
    from esp_retrieval.subspace.bundle import read_bundle
    from esp_retrieval.subspace.clustering import cluster_keywords, cluster_scores

    bundle = read_bundle(DEMO, verify_checksums=False)
    assert bundle.encoder_dir is not None
    encoder = QueryEncoder.load(bundle.encoder_dir)
    zero = dict.fromkeys(bundle.layout.names, 0.0)
    semantic = np.array(list({**zero, "semantic": 1.0}.values()))
    intent = np.array(list({**zero, "semantic": 0.3, "intent": 0.7}.values()))

    with (DATA / "orcas-i-gold" / "orcas_i_gold.tsv").open(encoding="utf-8") as fh:
        orcas = [row["query"] for row in csv.DictReader(fh, delimiter="\t")][:300]
    by_sem = cluster_keywords(encoder, orcas, bundle.layout, semantic, threshold=0.5)
    by_int = cluster_keywords(encoder, orcas, bundle.layout, intent, threshold=0.3)
    assert by_int.intent is not None and by_sem.intent is not None
    pure_int = cluster_scores(by_int.result.labels, by_int.intent)["purity"]
    assert pure_int >= 0.95
    assert pure_int >= cluster_scores(by_sem.result.labels, by_sem.intent)["purity"]

    keywords, topics = [], []
    with (DATA / "mimics-manual" / "MIMICS-Manual.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            q = row["query"].strip()
            for i in range(1, 6):
                o = (row[f"option_{i}"] or "").strip()
                kw = o if q.lower() in o.lower() else f"{q} {o}"
                if o and kw.lower() not in {k.lower() for k in keywords}:
                    keywords.append(kw)
                    topics.append(q)
            if len(keywords) >= 300:
                break
    nmi_sem = cluster_scores(
        cluster_keywords(encoder, keywords, bundle.layout, semantic, threshold=0.5).result.labels, topics
    )["nmi"]
    nmi_int = cluster_scores(
        cluster_keywords(encoder, keywords, bundle.layout, intent, threshold=0.3).result.labels, topics
    )["nmi"]
    assert nmi_sem >= nmi_int
