"""A consistent copy of part of the shipped data folder (``esp eval --quick``, condensed corpora).

The trainer and the benchmark both read a data folder, so slicing the files (rather than the
loaded objects) keeps them in agreement: the same queries, passages, labels and entities.
Kept: the first ``queries_per_year`` queries of each year that have gold entities (all when
null), their first ``pool_per_query`` pool candidates plus every relevant passage of theirs in
the pool (``corpus: judged``: only their judged passages in the pool),
``orcas_per_class`` ORCAS-I queries per label, and the rows of the first ``mimics_parents``
MIMICS queries.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from collections import defaultdict
from pathlib import Path

from esp_retrieval.training.evaluate.benchmark import YEARS, load_dl
from esp_retrieval.training.evaluate.config import DataSlice

TREC = "trec-dl-2019-2020-passage"


def make_data_slice(src: Path, dst: Path, spec: DataSlice) -> Path:
    """Write the slice under ``dst`` (created) and return it."""
    src, dst = Path(src), Path(dst)
    bench = load_dl(src / TREC, queries_per_year=spec.queries_per_year, pool_per_query=spec.pool_per_query,
                    corpus=spec.corpus)
    t_src, t_dst = src / TREC, dst / TREC
    (t_dst / "dl-hard").mkdir(parents=True, exist_ok=True)
    keep_q = {q for y in YEARS for q in bench.queries[y]}
    for y in YEARS:
        lines = [f"{q}\t{bench.queries[y][q]}" for q in bench.queries[y]]
        (t_dst / f"queries.{y}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        qrels = [ln for ln in (t_src / f"qrels.{y}-passage.txt").read_text().splitlines()
                 if ln.split() and ln.split()[0] in keep_q]
        (t_dst / f"qrels.{y}-passage.txt").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    with gzip.open(t_dst / "corpus.tsv.gz", "wt", encoding="utf-8") as f:
        for pid, text in zip(bench.pids, bench.texts, strict=True):
            f.write(f"{pid}\t{text}\n")
    present = set(bench.pids)
    with gzip.open(t_src / "pool.tsv.gz", "rt", encoding="utf-8") as fi, \
            gzip.open(t_dst / "pool.tsv.gz", "wt", encoding="utf-8") as fo:
        fo.write(next(fi))
        for line in fi:
            parts = line.split("\t")
            if parts[1] in keep_q and parts[4] in present:
                fo.write(line)
    gold = json.loads((t_src / "dl-hard" / "gold-entity-judgements.json").read_text(encoding="utf-8"))
    gold = {y: {q: v for q, v in d.items() if q in keep_q} for y, d in gold.items()}
    (t_dst / "dl-hard" / "gold-entity-judgements.json").write_text(json.dumps(gold, indent=1), "utf-8")
    for name in ("folds.json", "annotations.tsv"):
        shutil.copyfile(t_src / "dl-hard" / name, t_dst / "dl-hard" / name)

    o_dst = dst / "orcas-i-gold"
    o_dst.mkdir(parents=True, exist_ok=True)
    with (src / "orcas-i-gold" / "orcas_i_gold.tsv").open(encoding="utf-8", newline="") as f:
        header = f.readline()
        rows = f.read().splitlines()
    per: dict[str, int] = defaultdict(int)
    kept = []
    for r in rows:
        label = r.split("\t")[-1].strip()
        if spec.orcas_per_class is None or per[label] < spec.orcas_per_class:
            per[label] += 1
            kept.append(r)
    (o_dst / "orcas_i_gold.tsv").write_text(header + "\n".join(kept) + "\n", encoding="utf-8")

    m_dst = dst / "mimics-manual"
    m_dst.mkdir(parents=True, exist_ok=True)
    with (src / "mimics-manual" / "MIMICS-Manual.tsv").open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        head = next(reader)
        parents: list[str] = []
        out_rows = []
        for row in reader:
            if row[0] not in parents:
                if spec.mimics_parents is not None and len(parents) >= spec.mimics_parents:
                    continue
                parents.append(row[0])
            out_rows.append(row)
    with (m_dst / "MIMICS-Manual.tsv").open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        w.writerow(head)
        w.writerows(out_rows)
    return dst
