"""Learned term weights (esp_retrieval.training.term_weights): the block stays an exact dot product,
training moves the weights where BM25 ranks wrong, and only training queries are read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from esp_retrieval.subspace.sparse import SparseLexical
from esp_retrieval.training.config import SparseBlockSpec, TermWeightsSpec
from esp_retrieval.training.data.objectives import DataContext, Split
from esp_retrieval.training.sparse_lexical import build_block, build_bm25
from esp_retrieval.training.term_weights import (
    TermTrainingData,
    block_scores,
    build_lists,
    learn_term_weights,
    reweight,
)

# Query i is "<name_i> <code_i>"; its relevant passage holds the code once, a distractor holds the
# name twice. Codes also occur in unrelated passages, so BM25 (idf: name > code) puts the
# distractor first; a weight on the "numeric" feature puts the relevant passage first.
N = 16
NAMES = [f"w{chr(97 + i)}{chr(97 + (3 * i) % 26)}x" for i in range(N)]
CODES = [str(7100 + 13 * i) for i in range(N)]
TEXTS = [*(f"record {CODES[i]} listed here" for i in range(N)),
         *(f"{NAMES[i]} {NAMES[i]} overview page" for i in range(N)),
         *(f"misc {CODES[i]} {CODES[(i + 1) % N]} {CODES[(i + 2) % N]} table" for i in range(N))]
PIDS = [f"p{i}" for i in range(len(TEXTS))]


def _data(qids: range) -> TermTrainingData:
    return TermTrainingData({f"q{i}": f"{NAMES[i]} {CODES[i]}" for i in qids},
                            {f"q{i}": {f"p{i}": 3, f"p{N + i}": 0} for i in qids}, {})


def _first_is_relevant(block: SparseLexical, qids: range) -> float:
    s = block.scores(block.encode([f"{NAMES[i]} {CODES[i]}" for i in qids]))
    return float(np.mean([int(np.argmax(s[k])) == i for k, i in enumerate(qids)]))


SPEC = TermWeightsSpec(features=["idf", "numeric", "log_length"], steps=150, lr=0.1, l2=0.0, candidates=10)


def test_learning_fixes_what_bm25_ranks_wrong_on_unseen_queries() -> None:
    block = build_bm25(TEXTS)
    train, held = range(N // 2), range(N // 2, N)
    assert _first_is_relevant(block, held) == 0.0  # BM25 alone: the distractor wins every time
    learned = learn_term_weights(block, PIDS, TEXTS, _data(train), SPEC)
    assert learned.stats["loss_end"] < learned.stats["loss_start"]
    assert not np.allclose(learned.multiplier, 1.0)
    numeric = np.array([t.isdigit() for t in block.vocab])
    assert learned.multiplier[numeric].min() > learned.multiplier[~numeric].max()
    assert _first_is_relevant(learned.block, held) == 1.0  # the held-out queries were never read
    assert learned.block.params["term_weights"]["features"] == ["idf", "numeric", "log_length"]


def test_no_training_is_bm25_itself() -> None:
    block = build_bm25(TEXTS)
    same = learn_term_weights(block, PIDS, TEXTS, _data(range(4)), SPEC.model_copy(update={"steps": 0}))
    np.testing.assert_array_equal(same.multiplier, 1.0)
    q = block.encode(["wabx 7100", "record table"])
    np.testing.assert_allclose(same.block.scores(same.block.encode(["wabx 7100", "record table"])),
                               block.scores(q), rtol=1e-6)


def test_training_data_with_nothing_to_learn_from_is_refused() -> None:
    """No judged or entity-linked passage in the corpus: an error naming the setting, not BM25
    served silently as learned weights."""
    block = build_bm25(TEXTS)
    unjudged = TermTrainingData({"q0": f"{NAMES[0]} {CODES[0]}"}, {}, {})
    elsewhere = TermTrainingData({"q0": f"{NAMES[0]} {CODES[0]}"}, {"q0": {"p-not-in-corpus": 3}}, {})
    for data in (unjudged, elsewhere):
        with pytest.raises(ValueError, match=r"sparse\.term_weights: nothing to learn from"):
            learn_term_weights(block, PIDS, TEXTS, data, SPEC)


def test_the_learned_block_is_an_exact_dot_product_and_what_was_trained() -> None:
    block = build_bm25(TEXTS)
    a = np.random.default_rng(0).uniform(0.3, 3.0, len(block.vocab))
    learned = reweight(block, a, {"test": True})
    queries = [f"{NAMES[i]} {CODES[i]} record" for i in range(4)]
    got = learned.scores(learned.encode(queries))
    # by hand: sum_t c_t a_t w_td / sum_t c_t a_t idf_t, over the BM25 block's own weights
    col = {t: i for i, t in enumerate(block.vocab)}
    dense = block.docs.toarray().astype(np.float64)
    for k, text in enumerate(queries):
        ts = [col[t] for t in text.split()]
        want = sum(a[t] * dense[:, t] for t in ts) / sum(a[t] * float(block.idf[t]) for t in ts)
        np.testing.assert_allclose(got[k], want, rtol=1e-5)
    rows = np.array([[0, 5, -1], [N, 1, 2], [3, 2 * N, 0], [7, 8, 9]])
    np.testing.assert_array_equal(learned.scores_at(learned.encode(queries), rows),
                                  np.where(rows >= 0, np.take_along_axis(got, np.maximum(rows, 0), 1), 0.0))
    # the training loss scores exactly what the block serves
    lists = build_lists(block, PIDS, TEXTS, _data(range(4)), SPEC)
    trained = block_scores(lists, torch.from_numpy(block.idf.astype(np.float64)), torch.from_numpy(a)).numpy()
    full = learned.scores(learned.encode([f"{NAMES[i]} {CODES[i]}" for i in range(4)]))
    for k in range(4):
        cand = np.union1d(np.argsort(-block.scores(block.encode([f"{NAMES[k]} {CODES[k]}"]))[0],
                                     kind="stable")[:SPEC.candidates], [k, N + k])
        np.testing.assert_allclose(trained[k, :len(cand)], full[k, cand], rtol=1e-5)


def test_only_training_queries_are_read(tiny_data_dir: Path) -> None:
    ctx = DataContext(tiny_data_dir, Split(by="year", heldout_year="dl20"))
    data = TermTrainingData.from_context(ctx)
    assert data.qids and not data.qids & set(ctx.trec.queries["dl20"])
    assert data.qids <= set(ctx.trec.queries["dl19"])
    spec = SparseBlockSpec(term_weights=TermWeightsSpec(steps=5))
    block = build_block(spec, ctx.trec.pids, ctx.trec.passages, ctx)
    assert block.params["term_weights"]["lists"] >= 1
    with pytest.raises(ValueError, match="training data"):
        build_block(spec, ctx.trec.pids, ctx.trec.passages)


def test_unknown_feature_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown term features"):
        learn_term_weights(build_bm25(TEXTS), PIDS, TEXTS, _data(range(2)),
                           TermWeightsSpec(features=["idf", "nope"]))
