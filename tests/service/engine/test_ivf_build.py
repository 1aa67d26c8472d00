"""The ``ivf`` index build on ``faiss.Kmeans``: seeded, saved and read back, the bound kept."""

from __future__ import annotations

import numpy as np

from esp_retrieval.subspace.engine.ivf_index import IvfParams, build_index, load_index, save_index
from tests.service.engine.conftest import layout_of, random_rows


def test_the_faiss_kmeans_build_is_deterministic_and_round_trips(tmp_path) -> None:
    layout = layout_of("three")
    corpus = random_rows(4000, layout, seed=7)
    params = IvfParams(groups=(tuple(layout.names), (layout.names[0],)), nlist=20, seed=3)
    one, two = build_index(corpus, layout, params), build_index(corpus, layout, params)
    other = build_index(corpus, layout, IvfParams(nlist=20, seed=4))
    assert one.report["params"]["kmeans"] == "faiss"
    for p, q in zip(one.partitions, two.partitions, strict=True):
        for a in ("order", "offsets", "codes", "means", "variances", "radii"):
            np.testing.assert_array_equal(getattr(p, a), getattr(q, a))
    assert not np.array_equal(one.partitions[0].offsets, other.partitions[0].offsets)
    assert (one.partitions[0].sizes > 0).sum() > 10  # k-means spread the rows over the lists
    loaded = load_index(save_index(one, tmp_path / "ann", corpus), corpus, layout)
    for p, q in zip(one.partitions, loaded.partitions, strict=True):
        assert p.blocks == q.blocks
        for a in ("order", "offsets", "codes", "means", "variances", "radii"):
            np.testing.assert_array_equal(getattr(p, a), getattr(q, a))
    # the weight-aware bound still holds on the faiss lists: no member scores above its list's ub
    q = random_rows(5, layout, seed=8).astype(np.float64) * layout.expand(np.array([1.0, 0.3, 0.7]))
    part = one.partitions[0]
    blocknorm = np.sqrt((q**2) @ layout.indicator(np.float64))
    ub = q @ part.means.astype(np.float64).T + blocknorm @ part.radii.T  # (5, L)
    scores = q @ corpus[part.order].astype(np.float64).T  # positions in list order
    lists = np.repeat(np.arange(part.nlist), part.sizes)
    assert (scores <= ub[:, lists] + 1e-9).all()


def test_the_list_summaries_are_the_members_mean_spread_and_radius() -> None:
    layout = layout_of("three")
    corpus = random_rows(3000, layout, seed=11)
    index = build_index(corpus, layout, IvfParams(groups=(tuple(layout.names), (layout.names[1],)), nlist=12))
    for part in index.partitions:
        assert part.codes.shape == corpus.shape
        for j in range(part.nlist):
            rows = corpus[part.order[part.offsets[j] : part.offsets[j + 1]]].astype(np.float64)
            if not len(rows):
                continue
            np.testing.assert_allclose(part.means[j], rows.mean(0), atol=1e-6)
            np.testing.assert_allclose(part.variances[j], rows.var(0), atol=1e-6)
            dist = np.sqrt(((rows - part.means[j].astype(np.float64)) ** 2) @ layout.indicator(np.float64))
            assert (dist <= part.radii[j]).all()  # a bound on every member
            assert (part.radii[j] <= dist.max(0) + 1e-5).all()  # and a tight one
        # the codes hold each row at its list position
        np.testing.assert_array_equal(
            part.codes, np.clip(np.rint(corpus[part.order] * index.scale), -127, 127).astype(np.int8)
        )
