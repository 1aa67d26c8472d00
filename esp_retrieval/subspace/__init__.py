"""ESP core: subspace layouts, request weights, exact weighted scoring and the bundle contract.

Torch- and FastAPI-free on purpose: training and serving both score through this package,
so offline evaluation ranks exactly as the service does.
"""

from esp_retrieval.subspace.bundle import Bundle, BundleError, read_bundle, write_bundle
from esp_retrieval.subspace.layout import LayoutError, Objective, SubspaceLayout
from esp_retrieval.subspace.scoring import (
    normalize_blocks,
    scale_queries,
    subspace_scores,
    topk,
    weighted_scores,
)
from esp_retrieval.subspace.weights import WeightError, resolve_block_weights, resolve_weights

__all__ = [
    "Bundle",
    "BundleError",
    "LayoutError",
    "Objective",
    "SubspaceLayout",
    "WeightError",
    "normalize_blocks",
    "read_bundle",
    "resolve_block_weights",
    "resolve_weights",
    "scale_queries",
    "subspace_scores",
    "topk",
    "weighted_scores",
    "write_bundle",
]
