"""The ``ivf`` backend: weight-aware probing, exact re-rank, the bound certificate, index files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esp_retrieval.subspace.engine.ivf_index import (
    IvfIndexError,
    IvfParams,
    build_index,
    load_index,
    save_index,
)
from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.scoring import normalize_blocks
from tests.service.engine.conftest import layout_of, random_rows, reference_topk


def clustered(n: int, layout: SubspaceLayout, centres: int, spread: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((centres, layout.dim))
    rows = base[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, layout.dim))
    return normalize_blocks(rows.astype(np.float32), layout)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)) / truth.size


def hidden_tail_corpus(seed: int) -> tuple[SubspaceLayout, np.ndarray, np.ndarray, np.ndarray]:
    """Four clusters by block ``a``. In three, block ``b`` sits on one direction ``B0``; in the
    fourth it points anywhere. A query near cluster 1 in ``a`` and orthogonal to ``B0`` in
    ``b``, weighted towards ``b``: cluster 1 has the best centroid score, but the weighted top k
    are the cluster-4 rows whose ``b`` happens to face the query."""
    layout = SubspaceLayout.from_dims({"a": 8, "b": 8})
    rng = np.random.default_rng(seed)
    a_centres = np.eye(8)[:4] * 4.0
    b0 = np.zeros(8)
    b0[0] = 1.0
    n_per = 400
    rows = []
    for c in range(4):
        a = a_centres[c] + 0.05 * rng.standard_normal((n_per, 8))
        b = b0 + 0.05 * rng.standard_normal((n_per, 8)) if c < 3 else rng.standard_normal((n_per, 8))
        rows.append(np.hstack([a, b]))
    corpus = normalize_blocks(np.vstack(rows).astype(np.float32), layout)
    u = np.zeros(8)
    u[1:4] = 1.0
    q = np.hstack([a_centres[0], u])[None, :] + 0.01 * rng.standard_normal((6, 16))
    queries = normalize_blocks(q.astype(np.float32), layout)
    return layout, corpus, queries, np.array([0.2, 1.0])


def test_weight_aware_probing_finds_the_top_k_a_plain_ivf_misses(make_engine) -> None:
    import faiss

    layout, corpus, queries, w = hidden_tail_corpus(seed=1)
    n = len(corpus)
    truth = reference_topk(queries, corpus, w, layout, 10)[0]
    assert (truth >= 1200).all()  # the weighted top k all live in the fourth cluster
    scaled = np.ascontiguousarray((queries * layout.expand(w)).astype(np.float32))

    # plain IVF over the concatenated vector with the same block-scaled query, 4 lists, 1 probed
    plain = faiss.IndexIVFFlat(faiss.IndexFlatIP(layout.dim), layout.dim, 4, faiss.METRIC_INNER_PRODUCT)
    plain.train(corpus)
    plain.add(corpus)
    plain.nprobe = 1
    _, plain_rows = plain.search(scaled, 10)
    assert recall(plain_rows, truth) == 0.0  # it probes cluster 1: best centroid, no top-k row

    index = build_index(corpus, layout, IvfParams(nlist=4, seed=0))
    engine = make_engine("ivf", corpus, layout, index=index, max_touched=0.25, exact_below=0)
    res = engine.search(queries, w, 10)
    assert (engine.last_stats.touched <= n // 4).all()  # the same work: one list of four
    np.testing.assert_array_equal(res.rows, truth)


def test_exact_rerank_equals_the_exact_backend_whenever_the_candidates_hold_the_top_k(make_engine) -> None:
    layout = layout_of("three")
    corpus = clustered(6000, layout, centres=40, spread=0.8, seed=2)
    queries = clustered(40, layout, centres=40, spread=0.8, seed=2)
    w = np.random.default_rng(3).uniform(0.0, 1.0, (40, 3))
    exact = make_engine("numpy", corpus, layout)
    truth = exact.search(queries, w, 10)
    engine = make_engine("ivf", corpus, layout, max_touched=0.05, exact_below=0)
    scaled64 = queries.astype(np.float64) * layout.expand(w)
    bands, _ = engine._probe(scaled64, 10)
    res = engine.search(queries, w, 10)
    held = np.array([set(t) <= set(b.tolist()) for t, b in zip(truth.rows.tolist(), bands, strict=True)])
    assert held.any() and not held.all()  # measured: 5% of the rows holds some queries' top k, not all
    np.testing.assert_array_equal(res.rows[held], truth.rows[held])
    np.testing.assert_allclose(res.scores[held], truth.scores[held], rtol=0, atol=1e-6)
    np.testing.assert_allclose(res.subspace_scores[held], truth.subspace_scores[held], rtol=0, atol=1e-6)
    assert recall(res.rows[~held], truth.rows[~held]) < 1.0


@pytest.mark.parametrize("list_dtype", ["int8", "float32"])
def test_the_bound_certifies_exact_results_before_the_whole_corpus(make_engine, list_dtype: str) -> None:
    """Low-dimensional clustered data: the per-list bounds end the search early, exactly."""
    layout = SubspaceLayout.from_dims({"x": 3, "y": 2})
    corpus = clustered(8000, layout, centres=60, spread=0.05, seed=4)
    queries = clustered(16, layout, centres=60, spread=0.05, seed=4)
    w = np.array([1.0, 0.5])
    params = IvfParams(groups=(("x", "y"), ("y",)), nlist=64, list_dtype=list_dtype)
    engine = make_engine("ivf", corpus, layout, params=params)  # no max_touched: exact mode
    res = engine.search(queries, w, 10)
    np.testing.assert_array_equal(res.rows, reference_topk(queries, corpus, w, layout, 10)[0])
    stats = engine.last_stats
    assert stats.exact.all()
    assert stats.touched.max() < len(corpus) // 2  # measured: a few lists, not the corpus


def test_allowed_masks_keep_the_top_k_among_the_allowed_rows(make_engine) -> None:
    layout = layout_of("three")
    corpus = clustered(3000, layout, centres=30, spread=0.6, seed=5)
    queries = clustered(5, layout, centres=30, spread=0.6, seed=6)
    w = np.array([1.0, 0.4, 0.8])
    rng = np.random.default_rng(7)
    engine = make_engine("ivf", corpus, layout)
    for share in (0.05, 0.7):  # selective: an exact scan of the allowed rows; broad: masked probing
        mask = rng.random(len(corpus)) < share
        idx = np.flatnonzero(mask)
        rows, _ = reference_topk(queries, corpus[idx], w, layout, 10)
        res = engine.search(queries, w, 10, allowed=mask)
        np.testing.assert_array_equal(res.rows, idx[rows])
    none = engine.search(queries, w, 10, allowed=np.zeros(len(corpus), bool))
    assert none.rows.shape == (5, 0)
    with pytest.raises(ValueError, match="allowed must be a boolean mask") as err:
        engine.search(queries, w, 10, allowed=np.ones(3, bool))
    assert getattr(err.value, "field", None) == "allowed"


def test_settings_are_checked(make_engine) -> None:
    layout = layout_of("three")
    corpus = random_rows(200, layout, seed=8)
    for kw, field in (
        ({"max_touched": 0.0}, "max_touched"),
        ({"max_touched": 1.5}, "max_touched"),
        ({"target_misses": -1.0}, "target_misses"),
        ({"tail": "cauchy"}, "tail"),
    ):
        with pytest.raises(ValueError) as err:
            make_engine("ivf", corpus, layout, **kw)
        assert getattr(err.value, "field", None) == field
    with pytest.raises(IvfIndexError, match="list_dtype"):
        build_index(corpus, layout, IvfParams(list_dtype="int4"))
    with pytest.raises(IvfIndexError, match="block 'topic'"):
        build_index(corpus, layout, IvfParams(groups=(("topic",),)))
    other = build_index(corpus[:100], layout)
    with pytest.raises(IvfIndexError, match="built for 100 rows"):
        make_engine("ivf", corpus, layout, index=other)


# --- index files ----------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    layout = layout_of("uneven")
    corpus = clustered(1200, layout, centres=12, spread=0.5, seed=9)
    index = build_index(corpus, layout, IvfParams(groups=(("a", "b", "c", "d"), ("b",)), nlist=16))
    folder = save_index(index, tmp_path / "ann", corpus)
    return layout, corpus, index, folder


def test_a_saved_index_loads_back_and_searches_the_same(saved, make_engine) -> None:
    layout, corpus, index, folder = saved
    loaded = load_index(folder, corpus, layout)
    assert [p.blocks for p in loaded.partitions] == [p.blocks for p in index.partitions]
    for a, b in zip(loaded.partitions, index.partitions, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_array_equal(a.order, b.order)
    assert loaded.report["params"]["nlist"] == 16 and loaded.report["build_seconds"] >= 0
    queries = clustered(4, layout, centres=12, spread=0.5, seed=10)
    w = np.array([1.0, 0.5, 2.0, 0.0])
    kw = {"max_touched": 0.2, "exact_below": 0}  # the probing, not the small-N exact scan
    one = make_engine("ivf", corpus, layout, index=index, **kw).search(queries, w, 5)
    two = make_engine("ivf", corpus, layout, index=loaded, **kw).search(queries, w, 5)
    np.testing.assert_array_equal(one.rows, two.rows)
    listed = json.loads((folder / "ivf.json").read_text())["files"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*listed, "ivf.json"])


def _rewrite_json(folder, **changes: object) -> None:
    meta = json.loads((folder / "ivf.json").read_text())
    meta.update(changes)
    (folder / "ivf.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("flip_codes", r"p0\.codes\.npy: sha256 mismatch"),
        ("drop_file", r"p1\.means\.npy: listed in ivf\.json but missing"),
        ("bad_json", r"ivf\.json: not valid JSON"),
        ("no_json", r"ivf\.json: missing"),
        ("version", r"ivf\.json: format 'esp-ivf' version 99 is not supported"),
        ("rows", r"built for 7 rows, the corpus has 1200"),
        ("layout", r"built for layout \['a', 'b'\]"),
        ("unlisted", r"files does not list p1\.radii\.npy"),
    ],
)
def test_bad_index_files_are_refused(saved, damage: str, message: str) -> None:
    layout, corpus, _, folder = saved
    if damage == "flip_codes":
        raw = bytearray((folder / "p0.codes.npy").read_bytes())
        raw[-1] ^= 0x01
        (folder / "p0.codes.npy").write_bytes(bytes(raw))
    elif damage == "drop_file":
        (folder / "p1.means.npy").unlink()
    elif damage == "bad_json":
        (folder / "ivf.json").write_text("{not json")
    elif damage == "no_json":
        (folder / "ivf.json").unlink()
    elif damage == "version":
        _rewrite_json(folder, format_version=99)
    elif damage == "rows":
        _rewrite_json(folder, num_docs=7)
    elif damage == "layout":
        _rewrite_json(folder, layout=SubspaceLayout.from_dims({"a": 3, "b": 27}).to_dict())
    elif damage == "unlisted":
        meta = json.loads((folder / "ivf.json").read_text())
        del meta["files"]["p1.radii.npy"]
        (folder / "ivf.json").write_text(json.dumps(meta))
    with pytest.raises(IvfIndexError, match=message):
        load_index(folder, corpus, layout)


def test_an_index_for_another_corpus_or_with_inconsistent_arrays_is_refused(saved) -> None:
    layout, corpus, _, folder = saved
    other = corpus.copy()
    other[0] = other[1]
    with pytest.raises(IvfIndexError, match="built for another corpus"):
        load_index(folder, other, layout)
    # arrays that pass their checksums but do not describe a partition of the rows
    order = np.load(folder / "p0.order.npy")
    order[0] = order[1]
    np.save(folder / "p0.order.npy", order)
    with pytest.raises(IvfIndexError, match=r"p0\.order\.npy: is not a permutation"):
        load_index(folder, corpus, layout, verify_checksums=False)
    offsets = np.load(folder / "p1.offsets.npy")
    offsets[-1] += 1
    np.save(folder / "p1.offsets.npy", offsets)
    np.save(folder / "p0.order.npy", np.sort(order))  # valid again
    np.save(folder / "p0.order.npy", np.arange(len(corpus), dtype=np.int64))
    with pytest.raises(IvfIndexError, match=r"p1\.offsets\.npy: offsets must rise from 0 to 1200"):
        load_index(folder, corpus, layout, verify_checksums=False)
    np.save(folder / "p0.codes.npy", np.zeros((len(corpus), layout.dim), np.float32))
    with pytest.raises(IvfIndexError, match=r"p0\.codes\.npy: shape .* dtype float32, expected"):
        load_index(folder, corpus, layout, verify_checksums=False)
