"""The file format of a bundle's ``encoder/`` folder: one copy of its names and version.

Training writes the folder (``esp_retrieval.training.model.ESPModel.save_encoder``) and the query encoder
reads it (``esp_retrieval.encoder.query_encoder.QueryEncoder.load``); both take these constants from here.
The folder's layout and fields are documented in :mod:`esp_retrieval.encoder.query_encoder`.
"""

from __future__ import annotations

CONFIG_FILE = "esp_encoder.json"  # format, architecture, pooling, heads, layout, intent, ...
HEADS_FILE = "heads.safetensors"  # adapter + per-block heads + intent prototypes
TRANSFORMER_DIR = "transformer"  # the trunk: config.json + model.safetensors + tokenizer files
FORMAT = "esp-query-encoder"
FORMAT_VERSION = 3
#: versions this build reads: 1 has only linear heads, one per block; 2 adds lexical heads;
#: 3 adds a head's ``normalize_input``
READABLE_VERSIONS = (1, 2, 3)
