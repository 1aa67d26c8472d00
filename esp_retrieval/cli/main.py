"""The ``esp`` command line: one registry of subcommands, each imported only when used.

A subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int`` and a
docstring (its ``--help`` text). Adding one is one line in :data:`COMMANDS`. Modules are
imported lazily so ``esp --help`` and ``esp bundle-info`` never load torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

#: name -> (module in this package, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "train the multi-task ESP bi-encoder and export a bundle"),
    "features": ("features", "precompute the frozen-trunk features of a corpus"),
    "index": ("index", "embed a corpus file with a bundle's encoder into a new bundle"),
    "bundle-info": ("bundle_info", "validate a bundle and print its summary"),
    "fetch-bundle": ("fetch_bundle", "fetch a bundle from object storage, digest checked"),
    "export-st": ("export_st", "export a bundle's query encoder as a sentence-transformers folder"),
    "serve": ("serve", "serve a bundle over HTTP (search API, metrics, hot reload)"),
    "milvus-load": ("milvus_load", "write a bundle into a Milvus collection (resumable)"),
    "milvus-lite": ("milvus_lite", "serve one Milvus Lite file over TCP (several replicas share it)"),
    "cluster": ("cluster", "cluster keywords on weighted subspace similarity (CSV out)"),
    "eval": ("eval", "run the ESP ablation benchmark, write reports/esp-bench.md + plots"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="esp",
        description="ESP retrieval: multi-objective embeddings, weights chosen at serving time.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<14}{summary}" for name, (_, summary) in COMMANDS.items())
        + "\n\nRun `esp COMMAND --help` for a command's options.",
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        _top_parser().parse_args(args[:1] or ["--help"])
        return 2
    name = args[0]
    module = importlib.import_module(f"{__package__}.{COMMANDS[name][0]}")
    parser = argparse.ArgumentParser(
        prog=f"esp {name}",
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    module.add_arguments(parser)
    ns = parser.parse_args(args[1:])
    logging.basicConfig(
        level=logging.DEBUG if ns.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(module.run(ns) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
