"""PNG plots of the report (matplotlib, Agg backend: no display needed).

Each function takes plain numbers (no models) and writes one PNG atomically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esp_retrieval.subspace.atomic import atomic_open

_DPI = 110


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.0, 5.0)) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=size, squeeze=False)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        with atomic_open(path, "wb") as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".") or "png", dpi=_DPI)
    finally:
        plt.close(fig)
    return path


def pareto_plot(
    path: Path,
    points: Mapping[str, tuple[float, float, float, float]],
    sweeps: Mapping[str, np.ndarray],
    fronts: Mapping[str, np.ndarray],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
) -> Path:
    """Semantic (x) vs entity (y). ``points``: method -> (x, y, x_std, y_std) at default weights;
    ``sweeps``: method -> ``(M, 2)`` swept points; ``fronts``: method -> front row indices."""
    fig, axes = _figure(size=(13.0, 6.0))
    ax = axes[0, 0]
    colours = {}
    for i, (name, sw) in enumerate(sweeps.items()):
        c = f"C{i}"
        colours[name] = c
        ax.scatter(sw[:, 0], sw[:, 1], s=10, alpha=0.35, color=c)
        f = sw[fronts[name]]
        # 10 colours: from the 11th front on, dashed, so no two fronts look alike
        style = "-" if i < 10 else "--"
        ax.plot(f[:, 0], f[:, 1], style, color=c, lw=1.8, label=f"{name}: weight sweep front")
    markers = "osD^v<>ph*X"  # 11 shapes against 10 colours: no two unswept points look alike
    for j, (name, (x, y, xs, ys)) in enumerate(points.items()):
        # a swept method's point (its name plus a suffix) takes its front's colour
        c = next((colours[s] for s in sorted(colours, key=len, reverse=True) if name.startswith(s)),
                 f"C{len(sweeps) + j}")
        ax.errorbar(
            x,
            y,
            xerr=xs,
            yerr=ys,
            fmt=markers[j % len(markers)],
            color=c,
            ms=7,
            capsize=3,
            mec="black",
            label=f"{name}",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    # beside the axes, not on them: a dozen fronts and their points would hide the data
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return _save(fig, path)


def diagnostics_plot(
    path: Path,
    cosines: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]],
    projection_rate: Mapping[str, tuple[np.ndarray, np.ndarray]],
    norm_ratio: Mapping[str, tuple[np.ndarray, np.ndarray]],
    lambdas: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]],
    *,
    title: str,
) -> Path:
    """Four panels from training logs, each series ``(steps, values)``:
    pairwise gradient cosines (method -> pair -> series), PCGrad projection rate (method ->
    series), gradient-norm ratio (method -> series), DWA lambdas (method -> task -> series)."""
    fig, axes = _figure(2, 2, size=(12.0, 8.0))
    ax = axes[0, 0]
    styles = ["-", "--", ":", "-."]
    for i, (method, pairs) in enumerate(cosines.items()):
        for j, (pair, (s, v)) in enumerate(pairs.items()):
            ax.plot(s, v, styles[j % len(styles)], color=f"C{i}", lw=1.0, label=f"{method}: {pair}")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_title("cosine between task gradients on shared parameters", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=6)
    ax = axes[0, 1]
    for i, (method, (s, v)) in enumerate(projection_rate.items()):
        ax.plot(s, v, color=f"C{i}", lw=1.2, label=method)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("PCGrad: share of task pairs projected (rolling mean)", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    for i, (method, (s, v)) in enumerate(norm_ratio.items()):
        ax.plot(s, v, color=f"C{i}", lw=1.0, label=method)
    ax.set_yscale("log")
    ax.set_title("gradient-norm ratio max/min over tasks (log scale)", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for i, (method, tasks) in enumerate(lambdas.items()):
        for j, (task, (s, v)) in enumerate(tasks.items()):
            ax.plot(s, v, styles[j % len(styles)], color=f"C{i}", lw=1.2, label=f"{method}: {task}")
    ax.set_title("task weights lambda_k (DWA)", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def clustering_plot(
    path: Path,
    settings: Sequence[str],
    series: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str,
) -> Path:
    """One panel per metric (``series``: metric -> line label -> value per setting)."""
    n = len(series)
    fig, axes = _figure(1, n, size=(4.2 * n, 4.2))
    x = np.arange(len(settings))
    for ax, (metric, lines) in zip(axes[0], series.items(), strict=True):
        for i, (label, vals) in enumerate(lines.items()):
            ax.plot(x, vals, "o-", color=f"C{i}", label=label)
        ax.set_xticks(x)
        ax.set_xticklabels(settings, rotation=30, ha="right", fontsize=7)
        ax.set_title(metric, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
