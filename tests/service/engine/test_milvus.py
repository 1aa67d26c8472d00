"""The milvus backend (Milvus Lite) in the engine contract: the float64 brute-force top k, filtered too.

One Milvus Lite file per module; each corpus is written once into its own collection by
:func:`load_bundle` (what ``esp milvus-load`` runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from esp_retrieval.service.engine import BACKENDS, BackendUnavailable
from esp_retrieval.subspace.filters import FilterError, MetadataSchema, MetadataTable, compile_filter
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import reference_scores
from tests.service.engine.conftest import layout_of, random_rows, reference_topk, tied_corpus

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from esp_retrieval.service.engine.milvus_backend import (
    MilvusBackend,
    MilvusSettings,
    load_bundle,
    wait_for_index,
)

N = 1500


def _docs(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    langs = np.array(["en", "de", "fr", 'qu"o\\te'])
    out = []
    for _ in range(n):
        d: dict[str, Any] = {"lang": str(rng.choice(langs)), "year": int(rng.integers(1990, 2025))}
        d["text"] = f"display body {len(out)}"  # stored and returned, not filterable
        if rng.random() < 0.7:  # some documents have no score / no date / no flag
            d["score"] = float(rng.normal())
        if rng.random() < 0.8:
            d["published"] = f"{rng.integers(2000, 2025)}-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}"
        if rng.random() < 0.5:
            d["flag"] = bool(rng.random() < 0.5)
        out.append(d)
    return out


class Loaded:
    def __init__(self, root: Path) -> None:
        self.uri = str(root / "milvus.db")
        self.made: list[MilvusBackend] = []

    def engine(
        self,
        name: str,
        corpus: np.ndarray,
        layout: SubspaceLayout,
        docs: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> MilvusBackend:
        s = MilvusSettings(uri=self.uri, collection=name, **settings)
        schema = MetadataSchema.infer(docs)
        load_bundle(s, layout, corpus, [f"doc-{i}" for i in range(len(corpus))], docs, schema=schema)
        engine = MilvusBackend(corpus, layout, settings=s)
        self.made.append(engine)
        return engine


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    loaded = Loaded(tmp_path_factory.mktemp("milvus"))
    yield loaded
    for e in loaded.made:
        e.close()


def test_milvus_is_registered_and_needs_a_uri() -> None:
    assert BACKENDS["milvus"] is MilvusBackend
    layout = layout_of("one")
    with pytest.raises(BackendUnavailable, match="ESP_MILVUS_URI"):
        MilvusBackend(random_rows(4, layout, 0), layout, settings=MilvusSettings(uri=None))


@pytest.mark.parametrize("layout_name", ["three", "uneven"])
def test_exact_topk_with_per_row_weights(milvus: Loaded, layout_name: str) -> None:
    layout = layout_of(layout_name)
    corpus = random_rows(N, layout, seed=1)
    queries = random_rows(7, layout, seed=2)
    weights = np.random.default_rng(3).uniform(0.0, 2.0, (7, len(layout)))
    weights[0] = 0.0
    weights[0, 0] = 1.0
    engine = milvus.engine(f"exact_{layout_name}", corpus, layout)
    assert engine.index_type == "FLAT" and engine.exact
    for k in (1, 10, 1000):
        res = engine.search(queries, weights, k)
        rows, scores = reference_topk(queries, corpus, weights, layout, k)
        np.testing.assert_array_equal(res.rows, rows, err_msg=f"k={k}")
        np.testing.assert_allclose(res.scores, scores, rtol=0, atol=1e-6)
        sub = reference_scores(queries, corpus, np.eye(len(layout))[0], layout)  # block 0 cosines
        np.testing.assert_allclose(res.subspace_scores[..., 0], np.take_along_axis(sub, rows, 1), atol=1e-6)
    one = engine.search(queries[2:3], weights[2], 10)
    np.testing.assert_array_equal(
        one.rows[0], reference_topk(queries[2:3], corpus, weights[2], layout, 10)[0][0]
    )


def test_ties_at_the_cut_go_to_the_lower_row(milvus: Loaded) -> None:
    layout, corpus, queries, weights = tied_corpus()
    engine = milvus.engine("ties", corpus, layout)
    for k in (1, 10, 100):
        rows, _ = reference_topk(queries, corpus, weights, layout, k)
        np.testing.assert_array_equal(engine.search(queries, weights, k).rows, rows, err_msg=f"k={k}")


FILTERS: list[dict[str, Any]] = [
    {"field": "lang", "eq": "de"},
    {"field": "lang", "in": ["en", 'qu"o\\te']},
    {"field": "year", "gte": 2000, "lt": 2010.5},
    {"not": {"field": "score", "gt": 0.25}},  # includes documents without a score
    {"field": "published", "gte": "2010-01-01", "lte": "2015-06-30T12:00:00Z"},
    {
        "or": [
            {"field": "flag", "eq": True},
            {"and": [{"field": "lang", "eq": "fr"}, {"field": "year", "lt": 1995}]},
        ]
    },
    {"not": {"or": [{"field": "lang", "in": ["en", "de"]}, {"field": "flag", "eq": False}]}},
    {"and": [{"field": "year", "eq": 2003}, {"field": "lang", "eq": "en"}]},  # a handful of rows
    {"field": "year", "gt": 2100},  # none
]


def test_filters_equal_a_masked_brute_force(milvus: Loaded) -> None:
    layout = layout_of("three")
    corpus = random_rows(N, layout, seed=11)
    queries = random_rows(5, layout, seed=12)
    weights = np.random.default_rng(13).uniform(0.0, 2.0, (5, len(layout)))
    docs = _docs(N, seed=14)
    engine = milvus.engine("filtered", corpus, layout, docs)
    schema = engine.metadata_schema
    assert schema.to_dict() == MetadataSchema.infer(docs).to_dict()
    assert schema.fields["text"] == "text" and "text" not in schema.filterable()
    assert engine.documents([7])[0][1]["text"] == "display body 7"
    with pytest.raises(FilterError, match="not filterable"):
        compile_filter({"field": "text", "eq": "display body 7"}, schema)
    table = MetadataTable(schema, docs, N)
    full = reference_scores(queries, corpus, weights, layout)
    for spec in FILTERS:
        compiled = compile_filter(spec, schema)
        mask = compiled.mask(table)
        for k in (1, 10, 1000):
            kk = min(k, int(mask.sum()))
            expected = np.argsort(-np.where(mask, full, -np.inf), axis=1, kind="stable")[:, :kk]
            res = engine.search(queries, weights, k, allowed=compiled)
            got = res.rows[:, :kk]
            np.testing.assert_array_equal(got, expected, err_msg=f"{spec} k={k}")
            assert (res.rows[:, kk:] == -1).all()
        # the same mask given as rows (what the in-process backends take) answers the same
        if 0 < mask.sum() < 400:
            np.testing.assert_array_equal(
                engine.search(queries, weights, 10, allowed=mask).rows, res.rows[:, :10]
            )


def test_an_approximate_index_is_reranked_exactly(milvus: Loaded) -> None:
    layout = layout_of("three")
    corpus = random_rows(N, layout, seed=31)
    queries = random_rows(4, layout, seed=32)
    w = np.array([1.0, 0.5, 0.2])
    engine = milvus.engine("ivf", corpus, layout, index="IVF_FLAT", nlist=8, nprobe=8, candidates=64)
    assert engine.index_type == "IVF_FLAT" and not engine.exact
    res = engine.search(queries, w, 10)
    exact = reference_scores(queries, corpus, w, layout)
    np.testing.assert_allclose(res.scores, np.take_along_axis(exact, res.rows, 1), atol=1e-6)  # exact scores
    assert (np.diff(res.scores, axis=1) <= 0).all()
    rows, _ = reference_topk(queries, corpus, w, layout, 10)
    np.testing.assert_array_equal(res.rows, rows)  # every list probed: the exact answer


def test_the_approximate_search_settings_reach_milvus(milvus: Loaded) -> None:
    layout = layout_of("three")
    corpus = random_rows(N, layout, seed=33)
    engine = milvus.engine("ivf3", corpus, layout, index="IVF_FLAT", nlist=8, nprobe=3, candidates=40)
    assert engine.search_params(engine.candidates(10)) == {"metric_type": "IP", "params": {"nprobe": 3}}
    assert engine.candidates(10) == 40 and engine.candidates(100) == 112  # at least k + k / 8
    info = wait_for_index(engine._client, "ivf3", 30.0)  # the index covers every row
    assert info["index_type"] == "IVF_FLAT" and int(info.get("pending_index_rows", 0)) == 0
    queries = random_rows(3, layout, seed=34)
    w = np.array([0.0, 1.0, 0.3])
    res = engine.search(queries, w, 5)
    exact = reference_scores(queries, corpus, w, layout)
    np.testing.assert_allclose(res.scores, np.take_along_axis(exact, res.rows, 1), atol=1e-6)


def test_a_collection_of_another_corpus_is_refused(milvus: Loaded) -> None:
    layout = layout_of("three")
    corpus = random_rows(200, layout, seed=41)
    milvus.engine("guard", corpus, layout)
    other = random_rows(200, layout, seed=42)
    s = MilvusSettings(uri=milvus.uri, collection="guard")
    with pytest.raises(BackendUnavailable, match="another corpus"):
        MilvusBackend(other, layout, settings=s)
    with pytest.raises(BackendUnavailable, match="does not exist"):
        MilvusBackend(other, layout, settings=MilvusSettings(uri=milvus.uri, collection="missing"))


def test_upsert_and_delete_are_seen_by_the_next_search(milvus: Loaded) -> None:
    from esp_retrieval.service.engine import LiveDocument
    from esp_retrieval.service.engine.milvus_backend import LIVE_ROW0

    layout = layout_of("three")
    corpus = random_rows(300, layout, seed=51)
    docs = _docs(300, seed=52)
    engine = milvus.engine("writes", corpus, layout, docs)
    q = random_rows(1, layout, seed=53)
    w = layout.default_weights()
    [row] = engine.upsert([LiveDocument("new", q[0], {"lang": "xx", "year": 2030})])
    assert row >= LIVE_ROW0
    res = engine.search(q, w, 3)
    assert res.rows[0, 0] == row and engine.documents([row])[0][0] == "new"
    flt = compile_filter({"field": "lang", "eq": "xx"}, engine.metadata_schema)
    only = engine.search(q, w, 5, allowed=flt).rows[0]
    assert only[0] == row and (only[1:] == -1).all()
    # replacing a bundle document keeps its row
    [same] = engine.upsert([LiveDocument("doc-7", q[0], {"lang": "yy"})])
    assert same == 7
    assert engine.delete("new") and not engine.delete("new")
    top = engine.search(q, w, 3).rows[0].tolist()
    assert row not in top and top[0] == 7


def test_a_write_through_one_engine_is_shown_by_another_on_the_same_collection(milvus: Loaded) -> None:
    """Two engines on one collection (two replicas): the one that did not write shows the new
    fields and vector of a document it had already shown (its cache is refreshed by its reads)."""
    from esp_retrieval.service.engine import LiveDocument

    layout = layout_of("three")
    corpus = random_rows(300, layout, seed=71)
    docs = _docs(300, seed=72)
    writer = milvus.engine("replicas", corpus, layout, docs)
    reader = MilvusBackend(corpus, layout, settings=writer.settings)
    milvus.made.append(reader)
    w = layout.default_weights()
    q = corpus[5:6]
    assert reader.search(q, w, 1).rows[0, 0] == 5
    assert reader.documents([5]) == [("doc-5", writer.documents([5])[0][1])]  # cached by the reader now
    moved = random_rows(1, layout, seed=73)
    [row] = writer.upsert([LiveDocument("doc-5", moved[0], {"lang": "zz", "year": 1900})])
    assert row == 5
    res = reader.search(moved, w, 1)  # the new vector is what the reader finds ...
    assert res.rows[0, 0] == 5 and res.scores[0, 0] == pytest.approx(float(w.sum()), abs=1e-5)
    assert reader.documents([5]) == [("doc-5", {"lang": "zz", "year": 1900})]  # ... with the new fields
    assert reader.search(q, w, 1).rows[0, 0] != 5  # and no longer at the old vector


def test_session_consistency_searches_see_this_process_writes(milvus: Loaded) -> None:
    from pydantic import ValidationError

    from esp_retrieval.service.engine import LiveDocument

    with pytest.raises(ValidationError):
        MilvusSettings(uri=milvus.uri, consistency="Weak")
    layout = layout_of("three")
    corpus = random_rows(300, layout, seed=61)
    engine = milvus.engine("session", corpus, layout, consistency="Session")
    q = random_rows(2, layout, seed=62)
    w = np.array([1.0, 0.0, 0.4])
    rows, _ = reference_topk(q, corpus, w, layout, 10)
    np.testing.assert_array_equal(engine.search(q, w, 10).rows, rows)  # FLAT: still exact
    [row] = engine.upsert([LiveDocument("fresh", q[0], {})])
    assert engine.search(q[:1], w, 1).rows[0, 0] == row  # read-your-writes
