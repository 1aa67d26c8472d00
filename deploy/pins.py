"""Print the exact pins (from requirements.txt) of the project's core deps plus the named extras.

Docker images install only what they run: ``python deploy/pins.py serve > req.txt`` gives the
core and ``serve`` dependencies of pyproject.toml, each at the version requirements.txt pins,
so an image never resolves anything the test suite did not run with. A dependency without a
pin is an error (exit 2) rather than a silent "latest". Standalone (stdlib only): the Docker
dependency layer runs it before the project's code is copied in.

Usage: python deploy/pins.py [--root DIR] [--exclude NAME ...] EXTRA [EXTRA ...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(requirements: str) -> dict[str, str]:
    """Normalised name -> the full pinned line (``name[extras]==version``) of requirements.txt."""
    pins: dict[str, str] = {}
    for raw in requirements.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _NAME.match(line)
        if match is None or "==" not in line:
            raise ValueError(f"requirements.txt: {line!r} is not an exact pin (name==version)")
        pins[normalize(match.group(1))] = line
    return pins


def pinned(
    pyproject: str, requirements: str, extras: list[str], exclude: frozenset[str] = frozenset()
) -> list[str]:
    """Pinned requirement lines for the core dependencies plus ``extras``, in first-seen order."""
    project = tomllib.loads(pyproject)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown}; pyproject.toml defines {sorted(optional)}")
    pins = read_pins(requirements)
    lines: list[str] = []
    seen: set[str] = set()
    for spec in [*project.get("dependencies", []), *(d for e in extras for d in optional[e])]:
        match = _NAME.match(spec)
        if match is None:
            raise ValueError(f"pyproject.toml: cannot read the dependency {spec!r}")
        name = normalize(match.group(1))
        if name in seen or name in exclude:
            continue
        if name not in pins:
            raise ValueError(f"{spec!r} has no exact pin in requirements.txt")
        seen.add(name)
        lines.append(pins[name])
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="+", help="pyproject extras, e.g. serve or train")
    parser.add_argument("--root", type=Path, default=Path(), help="directory with pyproject.toml")
    parser.add_argument("--exclude", action="append", default=[], help="leave this package out")
    args = parser.parse_args(argv)
    try:
        lines = pinned(
            (args.root / "pyproject.toml").read_text(encoding="utf-8"),
            (args.root / "requirements.txt").read_text(encoding="utf-8"),
            args.extras,
            frozenset(normalize(n) for n in args.exclude),
        )
    except (OSError, ValueError) as exc:
        print(f"pins: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
