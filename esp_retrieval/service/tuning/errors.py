"""The registry's one error: an invalid registry file, bundle operating points or request value."""

from __future__ import annotations

from esp_retrieval.subspace.errors import FieldError


class RegistryError(FieldError):
    """An invalid registry (or bundle operating points, or a query's weight source).

    ``field`` is the dotted path at fault; the message names the file (when there is one), the
    field and what is allowed. The service answers it with 422.
    """
