"""Keyword clustering at several serving-weight settings (the first paper's use of the embeddings).

Clustering itself is :func:`esp_retrieval.subspace.clustering.cluster_embeddings` (the service's code:
weighted-subspace distance ``1 - s/W``, agglomerative or HDBSCAN), so the benchmark measures
what ``/v1/cluster`` would return. Scores:

- ORCAS-I queries: **intent purity** (share of clustered queries whose cluster's majority
  intent is their own; HDBSCAN noise is left out and reported as ``noise``), also over clusters
  of two or more only (``purity_multi``: singletons are pure by construction, and their share
  is ``singletons``), plus NMI/ARI against the intent labels.
- MIMICS "query + refinement" texts: **NMI / ARI** against the parent query (noise points
  count as singleton clusters), plus purity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esp_retrieval.subspace.layout import SubspaceLayout
from esp_retrieval.subspace.metrics import adjusted_rand, normalized_mutual_info, purity


@dataclass(frozen=True)
class ClusterSpec:
    """One clustering method with its parameters (``subspace.clustering.METHODS`` key + kwargs)."""

    method: str
    params: Mapping[str, Any]

    @property
    def label(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.method}({inner})"


def cluster_scores(
    emb: np.ndarray,
    truth: Sequence[str],
    layout: SubspaceLayout,
    weights: Mapping[str, float],
    spec: ClusterSpec,
) -> dict[str, float]:
    """Cluster ``emb (n, D)`` at ``weights`` and score the labels against ``truth``."""
    from esp_retrieval.subspace.clustering import cluster_embeddings

    res = cluster_embeddings(emb, layout, dict(weights), spec.method, **dict(spec.params))
    labels = res.labels
    ids, sizes = np.unique(labels[labels >= 0], return_counts=True)
    return {
        "n_clusters": float(res.n_clusters),
        "noise": float(np.mean(labels < 0)),
        "singletons": float(np.isin(labels, ids[sizes == 1]).mean()),
        "purity": purity(truth, labels),
        "purity_multi": purity(truth, labels, min_size=2),
        "nmi": normalized_mutual_info(truth, labels),
        "ari": adjusted_rand(truth, labels),
    }
