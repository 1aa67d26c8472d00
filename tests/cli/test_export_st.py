"""``esp export-st``: the folder loads with ``SentenceTransformer(path, trust_remote_code=True)``
offline, in a fresh process and in a fresh virtual environment without this project, and gives
the bundle encoder's vectors to 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from bench.live_server import child_env
from esp_retrieval.cli.main import main

TEXTS = ["how do I reset my password", "paris weather tomorrow", "a", "history of the roman empire " * 20]

LOAD = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], trust_remote_code=True)
vecs = model.encode(json.loads(sys.argv[2]), convert_to_numpy=True, batch_size=2)
np.save(sys.argv[3], np.asarray(vecs, dtype=np.float32), allow_pickle=False)
print(json.dumps({"dim": model.get_embedding_dimension()}))
"""


@pytest.fixture(scope="module")
def exported(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("st") / "st-encoder"
    assert main(["export-st", "--bundle", str(tiny_bundle), "--out", str(out)]) == 0
    return out


@pytest.mark.slow  # a fresh process loads sentence-transformers
def test_the_export_loads_offline_and_gives_the_encoders_vectors(
    exported: Path, tiny_bundle: Path, tmp_path: Path
) -> None:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    out_npy = tmp_path / "vecs.npy"
    env = child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(exported), json.dumps(TEXTS), str(out_npy)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out_npy, allow_pickle=False)
    expected = QueryEncoder.load(tiny_bundle / "encoder").encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), 32)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"dim": 32}
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # every block unit-norm, as the bundle's vectors are
    for start, stop in ((0, 16), (16, 24), (24, 32)):
        np.testing.assert_allclose(np.linalg.norm(got[:, start:stop], axis=1), 1.0, atol=1e-5)


def test_the_folder_holds_the_encoder_and_the_st_config(exported: Path) -> None:
    modules = json.loads((exported / "modules.json").read_text(encoding="utf-8"))
    assert modules == [{"idx": 0, "name": "0", "path": "", "type": "esp_st_module.ESPQueryEncoderModule"}]
    assert {"esp_st_module.py", "esp_query_encoder.py", "esp_layout.py", "esp_lexical.py"} <= {
        p.name for p in exported.glob("esp_*.py")}
    assert (exported / "esp_encoder.json").is_file() and (exported / "transformer" / "config.json").is_file()
    config = json.loads((exported / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert config["similarity_fn_name"] == "dot"


def test_refuses_an_existing_folder_and_a_bundle_without_encoder(
    exported: Path, tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export-st", "--bundle", str(tiny_bundle), "--out", str(exported)]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["export-st", "--bundle", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    assert not (tmp_path / "o").exists()


def _closure(name: str) -> list[metadata.Distribution]:
    """``name``'s installed distribution and those it requires, transitively (markers evaluated,
    extras not taken): what ``pip install name`` would have brought."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = canonicalize_name(todo.pop())
        if key in seen:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # an optional platform dependency that is not installed
        seen[key] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def fresh_venv(root: Path, requirement: str) -> Path:
    """A new venv (no system site-packages, no pip) whose site-packages holds links to the
    installed files of ``requirement`` and its dependencies, and nothing else: the environment
    ``pip install requirement`` gives, without downloading or copying gigabytes. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_paths()["data"])
    site = root / rel
    for dist in _closure(requirement):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
    return root / "bin" / "python"


PROBE = """
import importlib.util, json, sys
ours = [m for m in ("esp_retrieval",) if importlib.util.find_spec(m)]
import numpy as np
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], trust_remote_code=True, device="cpu")
vecs = model.encode(json.loads(sys.argv[2]), convert_to_numpy=True, batch_size=2)
np.save(sys.argv[3], np.asarray(vecs, dtype=np.float32), allow_pickle=False)
print(json.dumps({"ours": ours, "prefix": sys.prefix, "type": type(model[0]).__module__}))
"""


def test_the_export_loads_in_a_fresh_venv_without_this_project(
    exported: Path, tiny_bundle: Path, tmp_path: Path
) -> None:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    python = fresh_venv(tmp_path / "venv", "sentence-transformers")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}  # no PYTHONPATH
    out_npy = tmp_path / "vecs.npy"
    proc = subprocess.run([str(python), "-c", PROBE, str(exported), json.dumps(TEXTS), str(out_npy)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["ours"] == [], "the fresh environment must not see this project"
    assert Path(info["prefix"]) == tmp_path / "venv"
    assert info["type"].endswith("esp_st_module")  # the folder's own copy ran
    got = np.load(out_npy, allow_pickle=False)
    np.testing.assert_allclose(got, QueryEncoder.load(tiny_bundle / "encoder").encode(TEXTS), atol=1e-5, rtol=0)
