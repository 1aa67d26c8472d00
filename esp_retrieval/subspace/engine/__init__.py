"""The engine contract and its torch-free backend: exact weighted top-k by chunked scan.

:mod:`esp_retrieval.subspace.engine.base` states the contract every backend keeps; :class:`NumpyBackend`
is the reference the evaluation ranks through. The service's registry (``esp_retrieval.service.engine``)
adds the torch, faiss and cupy backends and the fallback chain.
"""
