"""The exported bundle validates with esp_retrieval.subspace.bundle alone (its encoder: tests/encoder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import TINY_DIMS, TINY_INTENT_CLASSES


def test_tiny_bundle_reads_back_with_subspace_alone(tiny_bundle: Path) -> None:
    code = (
        "import sys, json\n"
        "from esp_retrieval.subspace.bundle import read_bundle\n"
        f"b = read_bundle({str(tiny_bundle)!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('training', 'torch'))\n"
        "print(json.dumps({'n': len(b.ids), 'dim': b.layout.dim, 'names': list(b.layout.names),"
        " 'heavy': heavy, 'enc': b.encoder_dir is not None, 'docs': len(b.docs() or [])}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info == {
        "n": 60,
        "dim": sum(TINY_DIMS.values()),
        "names": list(TINY_DIMS),
        "heavy": [],
        "enc": True,
        "docs": 60,
    }


def test_manifest_sections(tiny_bundle: Path) -> None:
    from esp_retrieval.subspace.bundle import read_bundle

    m = read_bundle(tiny_bundle).manifest
    assert m["encoder"]["format"] == "esp-query-encoder"
    assert m["encoder"]["intent_classes"] == TINY_INTENT_CLASSES
    assert set(m["training"]) == {"config", "data_hashes", "final_metrics"}
    assert set(m["operating_points"]) == {"balanced", "entity_heavy"}


def test_every_exported_file_is_world_readable_and_owner_writable(
    tiny_bundle: Path, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    """safetensors writes 0600: the bundle and a bare encoder folder still open for any uid."""
    import stat

    from tests.conftest import build_tiny_model

    def modes(root: Path) -> set[tuple[bool, int]]:
        return {(p.is_dir(), stat.S_IMODE(p.stat().st_mode)) for p in [root, *root.rglob("*")]}

    assert modes(tiny_bundle) == {(True, 0o755), (False, 0o644)}
    enc = build_tiny_model(tiny_bert_dir).save_encoder(tmp_path / "encoder")
    assert (enc / "heads.safetensors").is_file() and modes(enc) == {(True, 0o755), (False, 0o644)}
