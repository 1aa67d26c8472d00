"""`import esp_retrieval.subspace` must stay light: no torch, no fastapi."""

import subprocess
import sys


def test_import_subspace_loads_neither_torch_nor_fastapi() -> None:
    code = (
        "import sys, esp_retrieval.subspace, esp_retrieval.cli.main, esp_retrieval.subspace.bundle\n"
        "heavy = sorted(m for m in ('torch', 'fastapi', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
