"""ESP retrieval service: FastAPI app, exhaustive weighted kNN engine, metrics.

Importing this package imports nothing heavy; submodules load torch/fastapi as they need.
"""
