"""Markdown table helpers for the report: mean ± std over seeds, fixed decimals, NaN as a dash."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) of the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def fmt(values: Sequence[float] | float, digits: int = 3) -> str:
    """``0.712 ± 0.004`` for several values, ``0.712`` for one, ``—`` when nothing is finite."""
    if isinstance(values, int | float):
        values = [float(values)]
    finite = [x for x in values if x is not None and math.isfinite(x)]
    if not finite:
        return "—"
    m, s = mean_std(finite)
    if len(finite) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; cells are ``str()``-ed, pipes escaped."""

    def cell(x: object) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"row has {len(r)} cells, header {len(header)}: {r!r}")
        lines.append("| " + " | ".join(cell(x) for x in r) + " |")
    return "\n".join(lines)
