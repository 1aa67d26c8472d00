"""A loaded query encoder shares no byte with its folder: its files may be edited in place or
truncated afterwards, and it encodes exactly as before (a memory-mapped weight would change the
vectors on an edit and fault, SIGBUS, on a truncation, so the encoder runs in a subprocess)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from esp_retrieval.encoder import EncoderError, QueryEncoder
from esp_retrieval.subspace import encoder_format
from esp_retrieval.subspace.bundle import read_bundle

CHANGES = ("edit", "truncate")


def tamper(path: Path, change: str) -> None:
    """``edit``: the second half of the file inverted in place (the same inode, as an in-place
    writer would); ``truncate``: the file cut to 0 bytes."""
    if change == "truncate":
        os.truncate(path, 0)
        return
    with path.open("r+b") as fh:
        data = bytearray(fh.read())
        half = len(data) // 2
        data[half:] = bytes(255 - b for b in data[half:])
        fh.seek(0)
        fh.write(data)


#: loads the encoder folder argv[1], then edits every file in place, then truncates every file,
#: encoding after each step; one JSON line per step, "done" at the end
VICTIM = r"""
import json, sys
from pathlib import Path
import numpy as np
from esp_retrieval.encoder import QueryEncoder
from tests.encoder.test_private_weights import CHANGES, tamper

root = Path(sys.argv[1])
texts = ["how to bake bread", "facebook login page", "cheap flights to paris", "what is a neuron"]
enc = QueryEncoder.load(root)
before, probs = enc.encode(texts), enc.intent_probs(texts)
files = sorted(p for p in root.rglob("*") if p.is_file())
for action in CHANGES:
    for path in files:
        tamper(path, action)
        same = bool(np.array_equal(enc.encode(texts), before) and np.array_equal(enc.intent_probs(texts), probs))
        print(json.dumps({"action": action, "file": path.relative_to(root).as_posix(), "same": same}), flush=True)
print("done", flush=True)
"""


def test_editing_or_truncating_the_files_after_load_changes_nothing(tiny_bundle: Path, tmp_path: Path) -> None:
    src = read_bundle(tiny_bundle).encoder_dir
    assert src is not None
    folder = Path(shutil.copytree(src, tmp_path / "encoder"))
    out = subprocess.run(
        [sys.executable, "-c", VICTIM, str(folder)],
        check=False, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )
    lines = out.stdout.splitlines()
    steps = [json.loads(line) for line in lines if line.startswith("{")]
    assert out.returncode == 0, f"the encoder's process died ({out.returncode}) after {steps[-1:]}:\n{out.stderr[-2000:]}"
    assert lines[-1] == "done"
    touched = {s["file"] for s in steps}
    assert {encoder_format.HEADS_FILE, f"{encoder_format.TRANSFORMER_DIR}/model.safetensors"} <= touched
    assert [s for s in steps if not s["same"]] == []


def test_a_file_that_is_not_the_one_listed_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    """Given the bundle's digests, the encoder checks the bytes it builds from: a file changed
    between the bundle's read and the encoder's load is refused by name."""
    bundle = read_bundle(tiny_bundle)
    assert bundle.encoder_dir is not None
    folder = Path(shutil.copytree(bundle.encoder_dir, tmp_path / "encoder"))
    digests = bundle.encoder_digests
    assert QueryEncoder.load(folder, digests=digests).layout == bundle.layout
    weights = folder / encoder_format.TRANSFORMER_DIR / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(4)
    weights.write_bytes(bytes(data))
    with pytest.raises(EncoderError, match=r"transformer/model\.safetensors: sha256 mismatch"):
        QueryEncoder.load(folder, digests=digests)
    (folder / encoder_format.TRANSFORMER_DIR / "extra.json").write_text("{}", encoding="utf-8")
    with pytest.raises(EncoderError, match=r"transformer/extra\.json: not listed"):
        QueryEncoder.load(folder, digests=digests)


def test_a_trunk_saved_in_shards_loads_the_same(tiny_bundle: Path, tmp_path: Path) -> None:
    from transformers import AutoModel

    src = read_bundle(tiny_bundle).encoder_dir
    assert src is not None
    folder = Path(shutil.copytree(src, tmp_path / "encoder"))
    trunk = folder / encoder_format.TRANSFORMER_DIR
    (trunk / "model.safetensors").unlink()
    AutoModel.from_pretrained(str(src / encoder_format.TRANSFORMER_DIR)).save_pretrained(
        str(trunk), max_shard_size="40KB"
    )
    assert (trunk / "model.safetensors.index.json").is_file() and len(list(trunk.glob("*.safetensors"))) > 1
    texts = ["how to bake bread", "facebook login page"]
    assert (QueryEncoder.load(folder).encode(texts) == QueryEncoder.load(src).encode(texts)).all()
