"""The cost of a metadata filter's ``in`` on the display text: the old string column against the
value -> code index of :class:`esp_retrieval.subspace.filters.MetadataTable`, in the same run; one JSON line.

The docs are the demo's (the TREC DL passage pool, ``--docs`` of them, as ``text``). ``old`` is
what the table held before the index: a fixed-width copy of every text (``astype(str)``) and
``np.isin`` over it. ``new`` is the table of a bundle that declares ``text`` a string (the only
way it is filterable now): one int32 code per row and a value -> code dict. ``inferred_bytes`` is
the table of an undeclared bundle, which holds no text at all. Bytes are what building each
table allocates (``tracemalloc``; the docs' own strings are not counted, they exist either way).
The filter is ``{"field": "text", "in": [...]}`` with ``--values`` texts, half of them present.

    python bench/filter_cost.py                   # the 24,884 passages; ~1 minute on 2 cores
    python bench/filter_cost.py --quick           # 2,000 passages, a few repeats: checks the script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, progress
from esp_retrieval.subspace.filters import MAX_IN_VALUES, MetadataSchema, MetadataTable, compile_filter


def old_column(docs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The string column as the table built it before the index: objects, then fixed width."""
    values = np.full(len(docs), "", dtype=object)
    present = np.zeros(len(docs), dtype=bool)
    for i, doc in enumerate(docs):
        text = doc.get("text")
        if isinstance(text, str):
            values[i], present[i] = text, True
    return values.astype(str), present


def allocated(build: Callable[[], Any]) -> tuple[Any, int]:
    """What ``build`` returns, and the bytes it left allocated."""
    tracemalloc.start()
    try:
        out = build()
        return out, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def ms(samples: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(samples) * 1e3, 3), "max": round(max(samples) * 1e3, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=None, help="passages (default: the whole pool)")
    parser.add_argument("--values", type=int, default=MAX_IN_VALUES, help="values of the 'in' list")
    parser.add_argument("--repeats", type=int, default=21, help="timed filters per side")
    parser.add_argument("--data", type=Path, default=None, help="data directory (default: the shipped one)")
    parser.add_argument("--quick", action="store_true", help="2,000 passages, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.repeats = args.docs or 2000, 3

    from esp_retrieval.training.data.trec import iter_corpus

    docs = [{"text": text} for _, text in iter_corpus(args.data, limit=args.docs)]
    progress(f"{len(docs)} passages; building the tables")
    rng = np.random.default_rng(0)
    half = args.values // 2
    chosen = rng.choice(len(docs), size=min(half, len(docs)), replace=False)
    absent = [f"absent text {i}" for i in range(args.values - len(chosen))]
    values = [docs[i]["text"] for i in chosen] + absent

    (old_col, old_present), old_bytes = allocated(lambda: old_column(docs))
    declared = MetadataSchema.from_dict({"text": "string"})
    table, new_bytes = allocated(lambda: MetadataTable(declared, docs, len(docs)))
    inferred = MetadataSchema.infer(docs)
    _, inferred_bytes = allocated(lambda: MetadataTable(inferred, docs, len(docs)))

    spec = {"field": "text", "in": values}
    old_t: list[float] = []
    new_t: list[float] = []
    compile_t: list[float] = []
    old_mask = new_mask = np.zeros(0, dtype=bool)
    for _ in range(args.repeats):  # interleaved, so both sides see the same machine
        t0 = time.perf_counter()
        old_mask = old_present & np.isin(old_col, np.asarray(values))
        t1 = time.perf_counter()
        compiled = compile_filter(spec, declared)  # the same on both sides: validate, coerce, key
        t2 = time.perf_counter()
        new_mask = compiled.mask(table)
        t3 = time.perf_counter()
        old_t.append(t1 - t0)
        compile_t.append(t2 - t1)
        new_t.append(t3 - t2)
    emit(
        {
            "bench": "filter_cost",
            "docs": len(docs),
            "in_values": len(values),
            "repeats": args.repeats,
            "matched_rows": int(new_mask.sum()),
            "masks_agree": bool(np.array_equal(old_mask, new_mask)),
            "old": {"ms": ms(old_t), "table_bytes": old_bytes, "column_dtype": str(old_col.dtype)},
            "new": {"ms": ms(new_t), "table_bytes": new_bytes},
            "compile_ms": ms(compile_t),
            "inferred_table_bytes": inferred_bytes,
            "inferred_text_type": inferred.to_dict().get("text"),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
