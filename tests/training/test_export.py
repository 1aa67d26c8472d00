"""The exported bundle validates with subspace.bundle alone (its encoder: tests/encoder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import TINY_DIMS, TINY_INTENT_CLASSES


def test_tiny_bundle_reads_back_with_subspace_alone(tiny_bundle: Path) -> None:
    code = (
        "import sys, json\n"
        "from subspace.bundle import read_bundle\n"
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
    from subspace.bundle import read_bundle

    m = read_bundle(tiny_bundle).manifest
    assert m["encoder"]["format"] == "esp-query-encoder"
    assert m["encoder"]["intent_classes"] == TINY_INTENT_CLASSES
    assert set(m["training"]) == {"config", "data_hashes", "final_metrics"}
    assert set(m["operating_points"]) == {"balanced", "entity_heavy"}
