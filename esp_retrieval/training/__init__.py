"""Offline training of the multi-task ESP bi-encoder and its export as a bundle (docs/architecture.md s. 5).

Python API (no CLI needed)::

    from esp_retrieval.training.config import TrainConfig, load_config
    from esp_retrieval.training.trainer import train

    cfg = load_config("configs/demo.yaml")            # YAML + ESP_TRAIN_* env overrides
    result = train(cfg, out_dir="artifacts/demo")       # out_dir=None: train only, no files
    result.model.encode(texts)        # (n, D) float32, every subspace block L2-normalised
    result.model.intent_probs(texts)  # (n, C) softmax over result.model.intent_classes
    result.metrics                    # held-out metrics {"start": {...}, "final": {...}}
    result.log_path                   # JSONL step log (None when out_dir is None)
    result.bundle_path                # exported bundle (None unless out_dir and export enabled)

Building blocks: :mod:`esp_retrieval.training.model` (``ESPModel``: trunk + adapter + heads + cosine intent
classifier), :mod:`training.features` (frozen-trunk feature cache), :mod:`esp_retrieval.training.losses`,
:mod:`training.weighting`, :mod:`esp_retrieval.training.surgery` (registries, one file per method),
:mod:`esp_retrieval.training.data` (loaders and objective data sets), :mod:`esp_retrieval.training.export`
(``export_bundle``), :mod:`esp_retrieval.training.tiny` (tiny random BERT for tests).
"""
