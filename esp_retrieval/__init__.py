"""ESP retrieval: multi-objective retrieval, trained once and tuned per request at serving time.

The one top-level package of the ``esp-retrieval`` distribution. Its sub-packages and what may
import what: docs/architecture.md, section 2.
"""
