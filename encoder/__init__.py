"""The bundle's query encoder at inference time (torch + transformers + safetensors).

Training writes the ``encoder/`` folder (format in :mod:`subspace.encoder_format`); the service
and ``esp index`` read it through :class:`QueryEncoder`. Never imports ``training`` or ``service``.
"""

from encoder.query_encoder import EncoderError, QueryEncoder

__all__ = ["EncoderError", "QueryEncoder"]
