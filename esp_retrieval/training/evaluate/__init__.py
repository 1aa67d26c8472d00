"""Offline evaluation of ESP models: the ablation benchmark, fronts, diagnostics, clustering.

``esp eval --config configs/eval.yaml --out reports/`` trains every method of the ablation on
cached frozen-trunk features, scores held-out queries exactly as the service does (through
the engine's numpy backend, :mod:`esp_retrieval.subspace.engine`), and writes ``reports/esp-bench.md`` with
its plots. Modules:

- :mod:`.metrics`: entity mentions, intent agreement, Kendall tau, effective rank, Pareto
  fronts, hypervolume (NDCG, P@k, macro-F1, purity, NMI, ARI: :mod:`esp_retrieval.subspace.metrics`).
- :mod:`.operating_points`: named weight settings on an ESP front, written into a bundle.
"""
