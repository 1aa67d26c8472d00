"""The exported bundle validates with subspace.bundle alone and its encoder reproduces the vectors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.conftest import TINY_DIMS, TINY_INTENT_CLASSES


def test_tiny_bundle_reads_back_with_subspace_alone(tiny_bundle: Path) -> None:
    code = (
        "import sys, json\n"
        "from subspace.bundle import read_bundle\n"
        f"b = read_bundle({str(tiny_bundle)!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('training', 'torch'))\n"
        "print(json.dumps({'n': len(b.ids), 'dim': b.layout.dim, 'names': list(b.layout.names),"
        " 'heavy': heavy, 'enc': b.encoder_dir is not None, 'docs': len(b.docs() or [])}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info == {
        "n": 60,
        "dim": sum(TINY_DIMS.values()),
        "names": list(TINY_DIMS),
        "heavy": [],
        "enc": True,
        "docs": 60,
    }


def test_manifest_sections(tiny_bundle: Path) -> None:
    from subspace.bundle import read_bundle

    m = read_bundle(tiny_bundle).manifest
    assert m["encoder"]["format"] == "esp-query-encoder"
    assert m["encoder"]["intent_classes"] == TINY_INTENT_CLASSES
    assert set(m["training"]) == {"config", "data_hashes", "final_metrics"}
    assert set(m["operating_points"]) == {"balanced", "entity_heavy"}


def test_query_encoder_matches_bundle_embeddings(tiny_bundle: Path, tiny_corpus) -> None:
    from encoder.query_encoder import QueryEncoder
    from subspace.bundle import read_bundle

    b = read_bundle(tiny_bundle)
    enc = QueryEncoder.load(b.encoder_dir)
    assert enc.layout == b.layout
    assert enc.intent_classes == TINY_INTENT_CLASSES
    vecs = enc.encode(tiny_corpus[1][:10], batch_size=3)
    assert vecs.dtype == np.float32 and vecs.shape == (10, b.layout.dim)
    np.testing.assert_allclose(vecs, np.asarray(b.embeddings[:10]), atol=1e-5)
    for name in b.layout.names:
        np.testing.assert_allclose(np.linalg.norm(vecs[:, b.layout.slice(name)], axis=1), 1.0, atol=1e-5)
    probs = enc.intent_probs(["how to bake bread", "facebook login"])
    assert probs.shape == (2, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    # deterministic: the same texts give the same vectors
    np.testing.assert_array_equal(enc.encode(tiny_corpus[1][:4]), enc.encode(tiny_corpus[1][:4]))
