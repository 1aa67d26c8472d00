"""The bundle's query encoder at inference time (torch + transformers + safetensors).

Training writes the ``encoder/`` folder (format in :mod:`esp_retrieval.subspace.encoder_format`); the service
and ``esp index`` read it through :class:`QueryEncoder`. Never imports ``training`` or ``service``.
"""

from esp_retrieval.encoder.query_encoder import EncoderError, QueryEncoder

__all__ = ["EncoderError", "QueryEncoder"]
