"""The ``esp`` command line: one dispatcher (:mod:`esp_retrieval.cli.main`), one module per subcommand.

The only package that names every other one (see docs/architecture.md, "Layers").
"""
