"""The layer rules of docs/architecture.md, checked on the source: arrows point down, no cycles.

The import graph is read statically (``ast``), so an import inside a function counts as much as
one at the top of a module: a lazy import still makes the layer depend on what it imports.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NS = "esp_retrieval"  # the one top-level package the distribution installs
SRC = ROOT / NS
#: the packages, as module names; bench/ and deploy/ are repository folders, never installed
PACKAGES = (*(f"{NS}.{p}" for p in ("subspace", "encoder", "training", "service", "client", "cli")), "bench", "deploy")

SUBSPACE, ENCODER, TRAINING, SERVICE, CLIENT, CLI = PACKAGES[:6]
#: package -> what it must never import (ours and third-party top-level names)
FORBIDDEN: dict[str, set[str]] = {
    SUBSPACE: {ENCODER, TRAINING, SERVICE, CLIENT, CLI, "torch", "fastapi", "starlette"},
    ENCODER: {TRAINING, SERVICE, CLIENT, CLI, "fastapi"},
    TRAINING: {SERVICE, CLIENT, CLI, "fastapi"},
    SERVICE: {TRAINING, CLIENT, CLI},
    CLIENT: {SUBSPACE, ENCODER, TRAINING, SERVICE, CLI, "torch", "fastapi"},
}


def top(name: str) -> str:
    """The package a module name belongs to: ``esp_retrieval.<package>``, or a top-level name."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == NS else parts[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg.replace(".", "/")).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def imports_of(name: str, path: Path) -> Iterator[str]:
    """Absolute names imported anywhere in the module (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    mods = project_modules()
    return {
        name: {imp for imp in imports_of(name, path) if imp in mods and imp != name}
        for name, path in mods.items()
    }


def test_the_graph_sees_the_packages() -> None:
    g = graph()
    assert "esp_retrieval.cli.main" in g
    assert "esp_retrieval.subspace.layout" in g["esp_retrieval.service.state"]
    assert "esp_retrieval.training.trainer" in g["esp_retrieval.cli.train"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_never_imports_what_sits_above_it(package: str) -> None:
    mods = project_modules()
    bad = sorted(
        f"{name} imports {imp}"
        for name, path in mods.items()
        if name == package or name.startswith(package + ".")
        for imp in imports_of(name, path)
        if top(imp) in FORBIDDEN[package]
    )
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    try:
        graphlib.TopologicalSorter(graph()).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_importing_the_core_loads_neither_torch_nor_fastapi() -> None:
    """The runtime view of the same rule: every subspace module imported in a fresh process."""
    names = [n for n in project_modules() if top(n) == SUBSPACE]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        f"print(sorted(m for m in ('torch', 'fastapi', 'starlette', {SERVICE!r}, {TRAINING!r}) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- the test layout (docs/architecture.md section 7) ------------------------------------------

TESTS = ROOT / "tests"


def test_every_test_folder_mirrors_a_package_folder() -> None:
    """``tests/<path>/`` exists only where ``esp_retrieval/<path>/`` (or ``bench/``, ``deploy/``) is a package folder."""
    folders = [p.parent.relative_to(TESTS) for p in TESTS.rglob("__init__.py") if p.parent != TESTS]
    assert folders, "no test packages found"
    unmirrored = [str(f) for f in folders if not any((r / f / "__init__.py").is_file() for r in (SRC, ROOT))]
    assert unmirrored == [], f"test folders without a package of the same path: {unmirrored}"


def test_each_tested_package_folder_has_its_test_folder() -> None:
    """Every sub-package of the service and the engine core has ``tests/<its path>/``."""
    wings = [p.parent.relative_to(SRC) for pkg in ("service", "subspace") for p in (SRC / pkg).glob("*/__init__.py")]
    untested = [str(w) for w in wings if w.name != "ui" and not (TESTS / w / "__init__.py").is_file()]
    assert untested == [], f"packages without a mirrored test folder: {untested}"


@pytest.mark.parametrize(
    ("registry", "tests"),
    [
        ("esp_retrieval.training.losses:LOSSES", ["training/test_losses.py"]),
        ("esp_retrieval.training.weighting:WEIGHTINGS", ["training/test_weighting.py", "training/test_weighting_uncertainty.py"]),
        ("esp_retrieval.training.surgery:SURGERIES", ["training/test_surgery.py"]),
    ],
)
def test_every_registered_method_is_named_in_its_test_file(registry: str, tests: list[str]) -> None:
    """The "test in" column of the extension table: each registered name appears in its tests."""
    import importlib

    module, _, attr = registry.partition(":")
    names = list(getattr(importlib.import_module(module), attr))
    text = "".join((TESTS / t).read_text() for t in tests)
    assert [n for n in names if f'"{n}"' not in text] == []


def test_every_subcommand_is_run_by_some_test() -> None:
    from esp_retrieval.cli.main import COMMANDS

    text = "".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    assert [c for c in COMMANDS if f'"{c}"' not in text] == []
