"""The one error base of the project: a message for a person and the field at fault.

Domain code (layout, weights, bundle, engine, registry, clustering, encoder, corpus) raises a
subclass of :class:`FieldError`; it knows nothing of HTTP. The service maps each class to a
status in one table (``esp_retrieval.service.errors``); the command line prints the message and exits 2.
"""

from __future__ import annotations


class FieldError(ValueError):
    """``message`` says what is wrong and what is allowed; ``field`` is the dotted path at fault
    (``weights.entity``, ``queries[0].vector``, ``manifest.json:layout``) or ``None``."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

