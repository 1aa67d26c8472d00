"""Training diagnostics from the trainer's JSONL step log (one record per step).

A step record is ``{"step", "tasks": {name: {"loss", "lambda", "grad_norm"}}, "pairs":
[{"tasks": [a, b], "cosine", "projected"}], ...}``; records without ``tasks`` (held-out
evaluations) are skipped. Gradients are the weighted task gradients on the *shared*
parameters (what PCGrad sees), so the norm ratio includes the lambdas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class StepLog:
    """Arrays over the logged steps: ``steps (S,)``; per task ``(S,)``; per pair ``(S,)``."""

    steps: np.ndarray
    loss: dict[str, np.ndarray]
    lam: dict[str, np.ndarray]
    grad_norm: dict[str, np.ndarray]
    cosine: dict[str, np.ndarray]  # "a/b" -> cosine
    projected: dict[str, np.ndarray]  # "a/b" -> 0/1

    @property
    def norm_ratio(self) -> np.ndarray:
        """max_k / min_k of the task gradient norms per step (``inf`` if one is 0)."""
        if not self.grad_norm:  # a run of 0 steps
            return np.zeros(0)
        g = np.stack(list(self.grad_norm.values()))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(g.max(axis=0) / g.min(axis=0))


def read_log(path: Path) -> StepLog:
    """Parse a JSONL step log; raises ``ValueError`` naming the line of a malformed record."""
    steps: list[int] = []
    loss: dict[str, list[float]] = {}
    lam: dict[str, list[float]] = {}
    norm: dict[str, list[float]] = {}
    cos: dict[str, list[float]] = {}
    proj: dict[str, list[float]] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc})") from exc
            if "tasks" not in rec:
                continue
            try:
                steps.append(int(rec["step"]))
                for name, t in rec["tasks"].items():
                    loss.setdefault(name, []).append(float(t["loss"]))
                    lam.setdefault(name, []).append(float(t["lambda"]))
                    norm.setdefault(name, []).append(float(t["grad_norm"]))
                for p in rec.get("pairs", []):
                    key = "/".join(p["tasks"])
                    cos.setdefault(key, []).append(float(p["cosine"]))
                    proj.setdefault(key, []).append(float(bool(p["projected"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: malformed step record ({exc!r})") from exc
    arr = {k: np.asarray(v) for k, v in loss.items()}
    return StepLog(
        np.asarray(steps), arr,
        {k: np.asarray(v) for k, v in lam.items()},
        {k: np.asarray(v) for k, v in norm.items()},
        {k: np.asarray(v) for k, v in cos.items()},
        {k: np.asarray(v) for k, v in proj.items()},
    )


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` values (same length as ``x``)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    c = np.cumsum(np.insert(np.asarray(x, dtype=np.float64), 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - window, 0)
    return np.asarray((c[idx] - c[lo]) / (idx - lo))


def summarize(logs: Sequence[StepLog]) -> dict[str, float]:
    """Means over runs and steps: per pair cosine, share of steps with cosine < 0, projection
    rate; the median gradient-norm ratio; the final lambdas (mean over runs)."""
    out: dict[str, float] = {}
    logs = [lg for lg in logs if lg.steps.size]  # a run of 0 steps (the initialisation) logs none
    if not logs:
        return out
    for key in logs[0].cosine:
        c = np.concatenate([lg.cosine[key] for lg in logs if key in lg.cosine])
        p = np.concatenate([lg.projected[key] for lg in logs if key in lg.projected])
        out[f"cos[{key}]"] = float(c.mean()) if c.size else float("nan")
        out[f"neg[{key}]"] = float((c < 0).mean()) if c.size else float("nan")
        out[f"proj[{key}]"] = float(p.mean()) if p.size else float("nan")
    ratios = np.concatenate([lg.norm_ratio for lg in logs])
    ratios = ratios[np.isfinite(ratios)]
    out["norm_ratio_median"] = float(np.median(ratios)) if ratios.size else float("nan")
    for name in logs[0].lam:
        out[f"lambda_final[{name}]"] = float(np.mean([lg.lam[name][-1] for lg in logs if lg.lam[name].size]))
    return out
