"""Check a registry file before it ships, or look up arms offline.

    python -m esp_retrieval.service.tuning check registry.yaml --bundle artifacts/bundle
    python -m esp_retrieval.service.tuning check registry.yaml --layout semantic=256,entity=96,intent=32
    python -m esp_retrieval.service.tuning assign registry.yaml EXPERIMENT UNIT_ID... --bundle B

``check`` validates exactly as the service does (against the bundle's layout and manifest
operating points) and prints a summary; exit status 1 and the error naming the field when
the file is invalid. ``assign`` prints one ``unit_id<TAB>arm<TAB>operating_point`` line per unit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from esp_retrieval.service.tuning.errors import RegistryError
from esp_retrieval.service.tuning.model import Registry
from esp_retrieval.subspace.layout import LayoutError, SubspaceLayout


def _layout_arg(text: str) -> SubspaceLayout:
    try:
        dims = {name.strip(): int(dim) for name, dim in (part.split("=") for part in text.split(","))}
        return SubspaceLayout.from_dims(dims)
    except (ValueError, LayoutError) as exc:
        raise argparse.ArgumentTypeError(f"--layout wants name=dim,name=dim,...: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m esp_retrieval.service.tuning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "assign"):
        p = sub.add_parser(name)
        p.add_argument("file", help="registry file (YAML, or JSON when it ends in .json)")
        if name == "assign":
            p.add_argument("experiment")
            p.add_argument("unit_ids", nargs="+", metavar="UNIT_ID")
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--bundle", help="bundle dir: its layout, sparse blocks, operating points")
        source.add_argument("--layout", type=_layout_arg, help="name=dim,... when no bundle is at hand")
    return parser


def _load(args: argparse.Namespace) -> Registry:
    if args.bundle is not None:
        from esp_retrieval.subspace.bundle import read_bundle

        bundle = read_bundle(args.bundle, verify_checksums=False)
        return Registry.load(args.file, bundle.weight_layout, bundle.operating_points)
    return Registry.load(args.file, args.layout)


def _summary(registry: Registry) -> dict[str, Any]:
    return {
        "default_operating_point": registry.default_operating_point,
        "operating_points": {n: {"weights": p.weights, "source": p.source}
                             for n, p in registry.operating_points.items()},
        "experiments": [e.to_dict() for e in registry.experiments.values()],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        registry = _load(args)
    except RegistryError as exc:
        print(f"invalid: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # BundleError, an unreadable bundle: say it plainly
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    if args.command == "assign":
        try:
            for unit in args.unit_ids:
                a = registry.assignment(args.experiment, unit)
                print(f"{unit}\t{a.arm.name}\t{a.arm.operating_point}" + ("" if a.included else "\texcluded"))
        except RegistryError as exc:  # an unknown experiment: the file itself is fine
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        return 0
    print(json.dumps(_summary(registry), indent=2))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
