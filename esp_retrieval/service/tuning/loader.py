"""Read a registry file (YAML, or JSON when the name ends in ``.json``) into plain data.

Duplicate keys are errors in both formats: PyYAML and ``json`` silently keep the last one,
which would let a copy-pasted operating point shadow another without a word. YAML aliases are
refused before anything is built: each one would share a subtree, so a few lines expand into
billions of values (the "billion laughs") once the document is walked. Empty files are
errors too (write ``{}`` for an empty registry), so a half-written file never wipes the
registry. Every problem is a :class:`RegistryError` naming the file and the problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from esp_retrieval.service.tuning.errors import RegistryError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys and aliases."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # An alias (``*name``, merge keys ``<<: *name`` too) shares a node: nine lines of aliases
        # of aliases expand to 10^9 values once validated (it held the event loop for 11 s).
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"alias *{event.anchor} is not allowed: write the value out", event.start_mark
            )
        return super().compose_node(parent, index)


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in out
        except TypeError:  # unhashable key (a list as a key): report it as such
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_text(text: str, name: str) -> Any:
    """Parse ``text`` as JSON if ``name`` ends in ``.json``, else as YAML."""
    if not text.strip():
        raise RegistryError(f"{name}: the file is empty; write {{}} for an empty registry")
    if name.endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError as exc:
            raise RegistryError(f"{name}: not valid JSON: {exc}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise RegistryError(f"{name}: not valid YAML: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: the problem and where (PyYAML's own text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read the registry file: {exc.strerror or exc}") from None


def decode(raw: bytes, name: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RegistryError(f"{name}: not UTF-8 text: {exc}") from None
    return parse_text(text, name)


def load_document(path: str | os.PathLike[str]) -> Any:
    """Read and parse the file at ``path`` (following symlinks, as a ConfigMap mount needs)."""
    return decode(read_bytes(path), str(path))
