"""Offline evaluation of ESP models: the ablation benchmark, fronts, diagnostics, clustering.

``esp eval --config configs/eval.yaml --out reports/`` trains every method of the ablation on
cached frozen-trunk features, scores held-out queries exactly as the service does (through
:mod:`subspace.scoring`), and writes ``reports/esp-bench.md`` with its plots. Modules:

- :mod:`.metrics`: NDCG@10 (trec_eval conventions), precision@10, macro-F1, intent agreement,
  Kendall tau, effective rank, Pareto fronts, hypervolume, cluster purity / NMI / ARI.
- :mod:`.operating_points`: named weight settings on an ESP front, written into a bundle.
"""
