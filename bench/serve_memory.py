"""Memory of one serving process on a demo-shaped bundle: RSS when ready, and the peak across a
reload (the served and the next bundle side by side); one JSON line. What the chart's default
requests and limits are sized from.

The bundle has the demo's shape without its training: an untrained ESPModel on the shipped
all-MiniLM-L6-v2 trunk with the demo's heads (semantic 384 identity, entity 1024 lexical, intent
32), the TREC DL passage pool as its docs (24,884 passages), and seeded block-normalised float32
rows (``--docs`` of them). Memory does not depend on the weights' values, so these are the
demo's bytes. A real ``esp serve`` (numpy backend) is started on loopback, answers one text
search, then reloads the same bundle through the admin route; ``VmRSS`` and ``VmHWM`` (the
peak) come from ``/proc/<pid>/status``.

    python bench/serve_memory.py --work /tmp/esp-mem            # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit, progress, random_corpus
from bench.live_server import start_server

DEMO_DIMS = {"semantic": 384, "entity": 1024, "intent": 32}


def build_bundle(out: Path, docs: int) -> Path:
    from esp_retrieval.training.data.trec import iter_corpus
    from esp_retrieval.training.export import export_bundle
    from esp_retrieval.training.model import ESPModel, HeadSpec, Trunk, TrunkMode
    from esp_retrieval.training.run import default_trunk_path

    trunk = Trunk.from_pretrained(default_trunk_path(), max_length=128, mode=TrunkMode.parse("frozen"))
    model = ESPModel(
        trunk, dict(DEMO_DIMS), intent_objective="intent",
        intent_classes=["informational", "navigational", "transactional"],
        head_specs={
            "semantic": HeadSpec(init="identity", trainable=False),
            "entity": HeadSpec(kind="lexical"),
            "intent": HeadSpec(normalize_input=True),
        },
    )
    rows = list(iter_corpus(limit=docs))
    emb = random_corpus(len(rows), model.layout, seed=0)
    payload = [{"text": r[1]} for r in rows]
    return export_bundle(out, model, [r[0] for r in rows], embeddings=emb, docs=payload, overwrite=True)


def status_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the bundle and the log")
    parser.add_argument("--docs", type=int, default=24_884, help="rows of the bundle (the demo's pool)")
    args = parser.parse_args(argv)
    bundle = args.work / "bundle"
    if not (bundle / "manifest.json").exists():
        progress(f"building a demo-shaped bundle of {args.docs} rows at {bundle}")
        build_bundle(bundle, args.docs)
    files_mb = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 1e6
    token = secrets.token_hex(8)
    with start_server(bundle, args.work / "server.log", settings={"backend": "numpy", "threads": 1},
                      token=token, args=["--log-level", "warning"], ready_timeout=300) as server:
        r = httpx.post(f"{server.url}/v1/search", json={"queries": [{"text": "who is robert gray"}], "k": 10},
                       timeout=60)
        r.raise_for_status()
        ready = status_kib(server.proc.pid)
        progress(f"ready: {ready}; reloading")
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(f"{server.url}/v1/admin/reload", headers=auth, timeout=300)
        r.raise_for_status()
        after = status_kib(server.proc.pid)
    mb = {"rss_ready_mb": ready["VmRSS"], "peak_before_reload_mb": ready["VmHWM"],
          "rss_after_reload_mb": after["VmRSS"], "peak_mb": after["VmHWM"]}
    emit({"bench": "serve_memory", "docs": args.docs, "dims": DEMO_DIMS,
          "bundle_files_mb": round(files_mb, 1), **{k: round(v / 1024, 1) for k, v in mb.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
