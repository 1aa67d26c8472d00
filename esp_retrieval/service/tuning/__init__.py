"""Operating points and A/B experiments: the registry file, deterministic arms, hot reload.

- :mod:`.schema`: the file as strict pydantic models; their errors become one
  :class:`RegistryError` (:mod:`.errors`) naming the dotted field and what is allowed.
- :mod:`.model`: :class:`Registry` (validated, immutable), :class:`OperatingPoint`,
  :class:`Experiment`, :class:`Arm`, and :meth:`Registry.resolve`, which turns one query's
  ``weights`` / ``operating_point`` / ``experiment`` + ``unit_id`` into ``(K,)`` weights.
- :mod:`.assignment`: ``sha256(salt:unit_id)`` buckets, stable across processes and replicas.
- :mod:`.loader`: YAML/JSON reading that rejects duplicate keys and empty files.
- :mod:`.watcher`: :class:`RegistryWatcher`, which re-reads the file (ConfigMap symlink swaps
  included), validates it against the served layout and keeps the old one when it is bad.

Imports point one way: errors <- loader, schema <- model <- watcher.

``python -m esp_retrieval.service.tuning check FILE --bundle DIR`` validates a file before it ships.
"""

from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.service.tuning.model import Arm, Assignment, Experiment, OperatingPoint, Registry, Resolved
from esp_retrieval.service.tuning.watcher import RegistryWatcher

__all__ = [
    "Arm",
    "Assignment",
    "Experiment",
    "OperatingPoint",
    "Registry",
    "RegistryError",
    "RegistryWatcher",
    "Resolved",
]
