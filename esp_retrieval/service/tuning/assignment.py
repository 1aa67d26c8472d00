"""Deterministic experiment assignment: ``(salt, unit id) -> bucket in [0, 1) -> arm``.

The bucket is the first 8 bytes of ``sha256(f"{salt}:{unit_id}")`` read as a big-endian
integer over ``2**64``. It depends on nothing but the two strings, so every process,
restart and replica (and any other language) computes the same arm; Python's ``hash()``
is salted per process and must never be used for this. A new salt draws fresh,
independent buckets, which reshuffles the units.

Traffic exclusion uses a second, independent bucket (``f"{salt}:traffic:{unit_id}"``), so
ramping ``traffic`` up only adds units and never moves an included unit to another arm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_SCALE = float(2**64)


def bucket(salt: str, unit_id: str) -> float:
    """Uniform in ``[0, 1)``, a pure function of ``salt`` and ``unit_id``."""
    digest = hashlib.sha256(f"{salt}:{unit_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def traffic_bucket(salt: str, unit_id: str) -> float:
    """The independent bucket that decides whether a unit is in the experiment at all."""
    return bucket(f"{salt}:traffic", unit_id)


def pick(shares: Sequence[float], u: float) -> int:
    """Index of the arm whose cumulative-share interval holds ``u``.

    Arms own ``[c_{i-1}, c_i)`` in configuration order. The last arm also takes whatever
    floating-point rounding leaves above the final cumulative sum (shares sum to 1 only to
    within 1e-9), so every bucket lands somewhere.
    """
    acc = 0.0
    for i, share in enumerate(shares[:-1]):
        acc += share
        if u < acc:
            return i
    return len(shares) - 1
