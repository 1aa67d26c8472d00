"""Distil a stronger bi-encoder (the teacher) into the semantic block, GPL-style, and measure it.

The signal is listwise (RankDistil / "Distilling Dense Representations for Ranking", Lin et al.
2020): for each training query the teacher's softmax over the *whole* passage pool,
``softmax(t_q . T_p / tau_t)``, is the target of the student's ``softmax(s . f(q) . S_p)``; the
loss is their KL divergence. ``T_p`` are the teacher's passage vectors, ``S_p`` the shipped
MiniLM trunk features of the same passages (data/trunk-features), so a step costs a
``(batch, 24,884)`` matrix product and no transformer pass.

What ``f`` is (``--student``):
  adapter  a linear map of the student's normalised query embedding, identity at start, on the
           query side only: the passage block stays the shipped trunk embedding
  shared   the same linear map on both sides (the passages are re-projected at export)
  docmap   the queries stay the student's; the passages are the teacher's vectors mapped into the
           student's space by a (768, 384) map, started at the ridge fit ``T_p M ~ S_p``: the
           larger model reads the (long) passages once at indexing, the small one the queries

``--min-teacher-score s`` keeps only the training queries whose best teacher cosine over the
pool is at least ``s``: the pool holds the passages retrieved for the evaluation topics, so most
MS MARCO queries have no relevant passage in it and their targets rank off-topic passages.

Queries come from MS MARCO (Anserini's topics in the pyserini 0.12.0 jar): passage dev and test
subsets, document dev and test, without any query equal or nearly equal (token Jaccard >= 0.8)
to one of the 97 TREC DL evaluation queries. The training is transductive over the pool's
passages (the teacher has scored them) but never sees an evaluation query or judgment.

    python -m bench.teacher_distill encode --teacher DIR --topics DIR --out CACHE
    python -m bench.teacher_distill train --cache CACHE [--student adapter] [--tau-t 0.05] ...

``train`` prints one JSON line: NDCG@10 and entity P@10 of the student zero-shot (the anchor),
the teacher zero-shot, and the distilled student, on the same 97 queries and pool.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np

from esp_retrieval.training.evaluate.benchmark import DLBench, load_dl

DATA = Path(__file__).resolve().parents[1] / "data"
TREC = DATA / "trec-dl-2019-2020-passage"
TOPIC_FILES = (
    "topics.msmarco-passage.dev-subset.txt",
    "topics.msmarco-passage.test-subset.txt",
    "topics.msmarco-doc.dev.txt",
    "topics.msmarco-doc.test.txt",
)
_WORD = re.compile(r"\w+")


def _tokens(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def training_queries(topics: Path, held_out: list[str], near: float = 0.8) -> list[tuple[str, str, str]]:
    """``(topic file, qid, query)`` of MS MARCO, deduplicated, none equal or nearly equal (token
    Jaccard >= ``near``) to a held-out query."""
    held = [_tokens(q) for q in held_out]
    seen: set[str] = set()
    out: list[tuple[str, str, str]] = []
    for name in TOPIC_FILES:
        for line in (topics / name).read_text(encoding="utf-8").splitlines():
            if "\t" not in line:
                continue
            qid, raw = line.split("\t", 1)
            text = " ".join(raw.split())
            key = text.lower()
            if not text or key in seen:
                continue
            seen.add(key)
            toks = _tokens(text)
            if any(len(toks & h) / max(1, len(toks | h)) >= near for h in held):
                continue
            out.append((name.removeprefix("topics.").removesuffix(".txt"), qid, text))
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def _bench() -> DLBench:
    return load_dl(TREC)


def _eval_queries(bench: DLBench) -> tuple[list[str], list[str]]:
    qids = [q for y in ("dl19", "dl20") for q in bench.queries[y] if q in bench.qrels[y]]
    texts = [bench.queries[y][q] for y in ("dl19", "dl20") for q in bench.queries[y] if q in bench.qrels[y]]
    return qids, texts


def encode(args: argparse.Namespace) -> None:
    """Teacher vectors of the pool, and both models' vectors of the train and eval queries."""
    import torch

    from esp_retrieval.training.features import pooled_features
    from esp_retrieval.training.model import Trunk, TrunkMode
    from esp_retrieval.training.run import default_trunk_path

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = _bench()
    _, eval_texts = _eval_queries(bench)
    rows = training_queries(Path(args.topics), eval_texts)
    train = [text for _, _, text in rows]
    (out / "train_queries.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    print(f"{len(train)} training queries", flush=True)
    frozen = TrunkMode.parse("frozen")
    student = Trunk.from_pretrained(default_trunk_path(), max_length=None, mode=frozen)
    shipped = pooled_features(student, bench.texts, readonly=[DATA / "trunk-features"])
    np.save(out / "student_pool.npy", shipped)
    for name, texts in (("eval", eval_texts), ("train", train)):
        np.save(out / f"student_{name}_q.npy", student.encode(texts, batch_size=256))
    teacher = Trunk.from_pretrained(args.teacher, max_length=None, mode=frozen)
    if args.bf16:
        teacher.model.to(torch.bfloat16)
    for name, texts in (("eval", eval_texts), ("train", train)):
        np.save(out / f"teacher_{name}_q.npy", teacher.encode(texts, batch_size=256))
    np.save(
        out / "teacher_pool.npy",
        pooled_features(
            teacher, bench.texts, cache_dir=out / "teacher_chunks", batch_size=32, desc="teacher pool"
        ),
    )


def _ndcg_entity(bench: DLBench, qids: list[str], scores: np.ndarray) -> tuple[float, float]:
    from esp_retrieval.subspace.metrics import ndcg_at_k, precision_at_k

    year_of = {q: y for y in ("dl19", "dl20") for q in bench.queries[y]}
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    nd, ep = [], []
    for i, q in enumerate(qids):
        rows = top[i]
        grades = bench.qrels[year_of[q]][q]
        nd.append(ndcg_at_k([bench.pids[r] for r in rows], grades, 10))
        if bench.entities.get(q):
            ep.append(precision_at_k([bench.mentions(q, int(r)) for r in rows], 10))
    return float(np.mean(nd)), float(np.mean(ep))


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812 (the PyTorch convention)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    c = Path(args.cache)
    bench = _bench()
    qids, _ = _eval_queries(bench)
    s_pool = torch.from_numpy(_normalise(np.load(c / "student_pool.npy")))
    t_pool = torch.from_numpy(_normalise(np.load(c / "teacher_pool.npy")))
    s_train = torch.from_numpy(_normalise(np.load(c / "student_train_q.npy")))
    t_train = torch.from_numpy(_normalise(np.load(c / "teacher_train_q.npy")))
    s_eval = torch.from_numpy(_normalise(np.load(c / "student_eval_q.npy")))
    t_eval = torch.from_numpy(_normalise(np.load(c / "teacher_eval_q.npy")))
    if args.min_teacher_score is not None:
        chunks = range(0, len(t_train), 2048)
        best = torch.cat([(t_train[i : i + 2048] @ t_pool.T).max(dim=1).values for i in chunks])
        keep = (best >= args.min_teacher_score).nonzero().ravel()
        s_train, t_train = s_train[keep], t_train[keep]
    result: dict[str, object] = {
        "bench": "teacher_distill",
        "student": args.student,
        "tau_t": args.tau_t,
        "lr": args.lr,
        "epochs": args.epochs,
        "seed": args.seed,
        "min_teacher_score": args.min_teacher_score,
        "train_queries": int(s_train.shape[0]),
        "pool": int(s_pool.shape[0]),
    }
    result["zero_shot_student"] = _ndcg_entity(bench, qids, (s_eval @ s_pool.T).numpy())
    result["zero_shot_teacher"] = _ndcg_entity(bench, qids, (t_eval @ t_pool.T).numpy())
    d = s_pool.shape[1]
    if args.student == "docmap":  # ridge start: the mapped teacher passages approximate the student's
        gram = t_pool.T @ t_pool + torch.eye(t_pool.shape[1])
        w = torch.nn.Parameter(torch.linalg.solve(gram, t_pool.T @ s_pool))
    else:
        w = torch.nn.Parameter(torch.eye(d))
    w_start = w.detach().clone()
    start_scale = torch.tensor(float(np.log(1.0 / args.tau_s)))
    log_scale = torch.nn.Parameter(start_scale, requires_grad=args.learn_scale)
    params = [w] + ([log_scale] if args.learn_scale else [])
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    n = s_train.shape[0]
    steps = args.epochs * ((n + args.batch - 1) // args.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.1)

    def project(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x @ w, dim=-1)

    def sides(queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(query vectors, passage vectors) of the student as ``--student`` defines it."""
        if args.student == "docmap":
            return queries, project(t_pool)
        return project(queries), project(s_pool) if args.student == "shared" else s_pool

    if args.student == "docmap":
        with torch.no_grad():
            q, docs = sides(s_eval)
            result["docmap_start"] = _ndcg_entity(bench, qids, (q @ docs.T).numpy())

    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        perm = torch.randperm(n)
        total = 0.0
        for start in range(0, n, args.batch):
            idx = perm[start : start + args.batch]
            with torch.no_grad():
                target = F.log_softmax(t_train[idx] @ t_pool.T / args.tau_t, dim=-1)
            q, docs = sides(s_train[idx])
            logits = q @ docs.T * log_scale.exp()
            loss = F.kl_div(F.log_softmax(logits, dim=-1), target, log_target=True, reduction="batchmean")
            if args.anchor:
                loss = loss + args.anchor * ((w - w_start) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss) * len(idx)
        with torch.no_grad():
            q, docs = sides(s_eval)
            nd, ep = _ndcg_entity(bench, qids, (q @ docs.T).numpy())
        print(f"epoch {epoch + 1}: loss {total / n:.4f}  NDCG@10 {nd:.4f}  entity P@10 {ep:.4f}", flush=True)
    result["distilled"] = (nd, ep)
    result["scale"] = float(log_scale.exp())
    result["train_s"] = round(time.perf_counter() - t0, 1)
    if args.save:
        np.save(args.save, w.detach().numpy())
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="teacher vectors of the pool; both models' query vectors")
    e.add_argument("--teacher", required=True, help="folder of the teacher model (all-mpnet-base-v2)")
    e.add_argument("--topics", required=True, help="folder with Anserini's MS MARCO topic files")
    e.add_argument("--out", required=True, help="cache folder for the vectors")
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--bf16", action="store_true", help="teacher in bfloat16 (2x faster, AVX-512 BF16)")
    t = sub.add_parser("train", help="distil into the student and print one JSON line")
    t.add_argument("--cache", required=True)
    t.add_argument("--student", choices=("adapter", "shared", "docmap"), default="adapter")
    t.add_argument("--min-teacher-score", type=float, help="keep queries whose best teacher cosine >= this")
    t.add_argument("--tau-t", type=float, default=0.05, help="teacher softmax temperature")
    t.add_argument("--tau-s", type=float, default=0.05, help="student temperature (start, if learned)")
    t.add_argument("--learn-scale", action="store_true")
    t.add_argument("--anchor", type=float, default=0.0, help="L2 pull of the map towards its start")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--save", help="write the learned map (d, d) here (.npy)")
    args = p.parse_args(argv)
    {"encode": encode, "train": train}[args.cmd](args)


if __name__ == "__main__":
    main()
