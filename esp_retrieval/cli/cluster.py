"""Cluster keywords on the weighted subspace similarity and write one CSV row per keyword.

Embeds the keywords with the bundle's query encoder, clusters them on
``1 - sum_k w_k cos_k / sum_k w_k`` (the search score, normalised), and writes
``keyword, cluster_id, cluster_label, intent, intent_probability, similarity_to_label``
sorted by cluster (largest first; unclustered keywords, cluster_id -1, last).

Input: ``.txt`` (one keyword per line, blank lines skipped) or ``.csv`` / ``.tsv`` with a header
row (the ``--column`` column, else a ``keyword`` column, else the first column). Duplicates
after case-folding and whitespace collapsing are merged (first spelling kept, lines logged), so
every distinct keyword appears exactly once. Weights: ``--weights semantic=0.7,intent=0.3``
(names left out take the layout's default weight) or ``--operating-point NAME`` from the bundle.

Exit status 0 on success, 2 on bad input (empty file, unknown weight name or column, ...).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esp_retrieval.subspace.atomic import atomic_open
from esp_retrieval.subspace.clustering import (
    METHODS,
    ClusteringError,
    cluster_keywords,
    cluster_scores,
    dedupe_keywords,
)
from esp_retrieval.subspace.errors import FieldError

log = logging.getLogger("esp.cluster")

COLUMNS = ("keyword", "cluster_id", "cluster_label", "intent", "intent_probability", "similarity_to_label")
DELIMITERS = {".csv": ",", ".tsv": "\t"}
SUFFIXES = (".txt", *DELIMITERS)


class InputError(FieldError):
    """Unusable command-line input; the message says what is wrong and what is allowed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, type=Path, help="bundle directory (with encoder/)")
    parser.add_argument("--input", required=True, type=Path, help="keywords: .txt, .csv or .tsv")
    parser.add_argument("--out", required=True, type=Path, help="output CSV (written atomically)")
    parser.add_argument("--column", help="keyword column of a .csv/.tsv (default: 'keyword', else the first)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--weights", help="subspace weights, e.g. semantic=0.7,intent=0.3 (others: layout default)"
    )
    source.add_argument("--operating-point", help="named weights from the bundle manifest")
    parser.add_argument("--method", default="agglomerative", choices=sorted(METHODS))
    parser.add_argument(
        "--threshold", type=float, help="agglomerative: cut at this distance 1 - s/W (default 0.4)"
    )
    parser.add_argument("--min-cluster-size", type=int, help="hdbscan: smallest cluster (default 3)")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='other method parameter (JSON value), e.g. linkage="complete", knn=30, dense_limit_mb=512',
    )
    parser.add_argument(
        "--truth",
        metavar="COLUMN",
        help="a .csv/.tsv column of known groups: print purity, NMI and ARI of the clusters against it",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="keywords per encoder batch")


@dataclass
class Keywords:
    texts: list[str]
    lines: list[int]  # 1-based file line of each text
    truth: list[str] | None


def read_keywords(path: Path, column: str | None = None, truth: str | None = None) -> Keywords:
    """Read keywords (and an optional truth column) from a .txt/.csv/.tsv file."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"--input must end in one of {list(SUFFIXES)}, got {path.name!r}")
    if not path.is_file():
        raise InputError(f"--input {path} does not exist")
    with path.open(encoding="utf-8-sig", newline="") as fh:
        if suffix == ".txt":
            if column or truth:
                raise InputError("--column and --truth need a .csv or .tsv input")
            pairs = [(i, line.strip()) for i, line in enumerate(fh, start=1)]
            kept = [(i, t) for i, t in pairs if t]
            return Keywords([t for _, t in kept], [i for i, _ in kept], None)
        reader = csv.reader(fh, delimiter=DELIMITERS[suffix])
        header = next(reader, None)
        if header is None:
            raise InputError(f"--input {path} is empty: expected a header row and one keyword per row")
        names = [h.strip() for h in header]
        col = _column_index(names, column, "--column", default="keyword")
        tcol = _column_index(names, truth, "--truth") if truth else None
        texts, lines, groups = [], [], []
        for row in reader:
            text = row[col].strip() if col < len(row) else ""
            if not text:
                continue
            texts.append(text)
            lines.append(reader.line_num)
            if tcol is not None:
                groups.append(row[tcol].strip() if tcol < len(row) else "")
        return Keywords(texts, lines, groups if tcol is not None else None)


def _column_index(names: list[str], wanted: str | None, option: str, default: str | None = None) -> int:
    lowered = [n.lower() for n in names]
    if wanted is not None:
        if wanted.lower() not in lowered:
            raise InputError(f"{option} {wanted!r} is not a column; columns: {names}")
        return lowered.index(wanted.lower())
    return lowered.index(default) if default in lowered else 0


def parse_weights(text: str | None) -> dict[str, float] | None:
    """``"semantic=0.7,intent=0.3"`` -> ``{"semantic": 0.7, "intent": 0.3}`` (names checked later)."""
    if not text:
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"--weights must look like semantic=0.7,intent=0.3; bad part {part!r}") from None
    return out


def method_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.threshold is not None:
        params["threshold"] = args.threshold
    if args.min_cluster_size is not None:
        params["min_cluster_size"] = args.min_cluster_size
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--param must be KEY=VALUE, got {item!r}")
        try:
            params[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip().replace("-", "_")] = value  # a bare word: a string parameter
    return params


def resolve_weights(bundle: Any, weights: dict[str, float] | None, operating_point: str | None) -> Any:
    """``(K,)`` weights from ``--weights`` (names left out take the layout default) or from a
    named operating point in the bundle manifest -- one source, as in ``POST /v1/search``."""
    from esp_retrieval.subspace.weights import resolve_block_weights

    if operating_point is not None:
        points = bundle.operating_points
        if operating_point not in points:
            raise InputError(
                f"--operating-point {operating_point!r} is not in the bundle; available: {sorted(points)}"
            )
        return resolve_block_weights(
            points[operating_point].get("weights"), bundle.layout, field=f"operating point {operating_point}"
        )
    return resolve_block_weights(weights, bundle.layout, field="--weights")


def write_csv(path: Path, rows: list[dict[str, Any]], extra: str | None = None) -> None:
    """Write atomically (:mod:`esp_retrieval.subspace.atomic`): readers never see a partial CSV."""
    columns = (*COLUMNS, *([extra] if extra else []))
    with atomic_open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for r in rows:
            writer.writerow([_cell(r.get(c)) for c in columns])


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return value


def run(args: argparse.Namespace) -> int:
    from esp_retrieval.subspace.bundle import BundleError, read_bundle
    from esp_retrieval.subspace.weights import WeightError

    try:
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
        params = method_kwargs(args)
        weights = parse_weights(args.weights)
        data = read_keywords(args.input, args.column, args.truth)
        if not data.texts:
            raise InputError(f"--input {args.input} has no keywords")
        keywords, merged = dedupe_keywords(data.texts)
        if merged:
            shown = ", ".join(f"line {data.lines[p]} = line {data.lines[q]}" for p, q in merged[:10])
            more = f" and {len(merged) - 10} more" if len(merged) > 10 else ""
            log.info("merged %d duplicate keywords (case/space-insensitive): %s%s", len(merged), shown, more)
        bundle = read_bundle(args.bundle, verify_checksums=False)
        block_w = resolve_weights(bundle, weights, args.operating_point)
        if bundle.encoder_dir is None:
            raise InputError(f"--bundle {args.bundle} has no encoder/ folder: it cannot embed keywords")
        rows, summary, scores = _cluster(
            args, bundle, keywords=keywords, block_w=block_w, params=params, data=data, merged=merged
        )
    except (InputError, ClusteringError, WeightError, BundleError) as exc:
        print(f"esp cluster: error: {exc}", file=sys.stderr)
        return 2
    write_csv(args.out, rows, "truth" if args.truth else None)
    clustered = [s for s in summary if s["size"] > 1]
    noise = sum(1 for r in rows if r["cluster_id"] < 0)
    log.info(
        "%d keywords -> %d clusters (%d with 2+ keywords), %d unclustered; wrote %s",
        len(rows),
        len(summary),
        len(clustered),
        noise,
        args.out,
    )
    for s in summary[:5]:
        log.info("  cluster %d (%d): %s  intents %s", s["cluster_id"], s["size"], s["label"], s["intent_mix"])
    if scores is not None:
        print(json.dumps(scores))
    return 0


def _cluster(
    args: argparse.Namespace,
    bundle: Any,
    *,
    keywords: list[str],
    block_w: Any,
    params: dict[str, Any],
    data: Keywords,
    merged: list[tuple[int, int]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    from tqdm import tqdm

    from esp_retrieval.encoder.query_encoder import QueryEncoder
    from esp_retrieval.subspace.weights import weights_dict

    encoder = QueryEncoder.load(bundle.encoder_dir)
    t0 = time.perf_counter()
    with tqdm(total=len(keywords), desc="embedding", unit="kw", disable=None) as bar:
        clusters = cluster_keywords(
            encoder,
            keywords,
            bundle.layout,
            block_w,
            args.method,
            batch_size=args.batch_size,
            progress=bar.update,
            **params,
        )
    elapsed = time.perf_counter() - t0
    log.info(
        "clustered %d keywords in %.1f s (%s, weights %s, %s)",
        len(keywords),
        elapsed,
        clusters.result.method,
        weights_dict(block_w, bundle.layout),
        clusters.result.params,
    )
    rows = clusters.rows()
    scores: dict[str, Any] | None = None
    if data.truth is not None:
        dropped = {p for p, _ in merged}
        truth = [t for p, t in enumerate(data.truth) if p not in dropped]
        for row, t in zip(rows, truth, strict=True):
            row["truth"] = t
        scores = {"keywords": len(rows)}
        scores.update({k: round(v, 4) for k, v in cluster_scores(clusters.result.labels, truth).items()})
    order = sorted(
        range(len(rows)),
        key=lambda i: (
            rows[i]["cluster_id"] < 0,
            rows[i]["cluster_id"],
            -(rows[i]["similarity_to_label"] or 0),
            i,
        ),
    )
    return [rows[i] for i in order], clusters.summary(), scores
