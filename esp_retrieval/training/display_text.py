"""Repair the display text of documents at indexing (``ftfy``): what ``docs.jsonl`` shows users.

MS MARCO passages carry mojibake: UTF-8 decoded as Windows-1252 once (``Europeâ€™s`` for
``Europe’s``), HTML entities, stray control characters. :func:`repair_display` runs
``ftfy.fix_text`` on the string display fields (``text``, ``title``) of a document's payload, so
search hits and the playground show the intended characters.

The **embedding input is not repaired**: the encoder embeds the text exactly as the corpus has
it, so a re-index gives bitwise the embeddings (and held-out metrics) it gave before. Repairing
the embedding input as well changes the tokens of the affected passages and would need a
held-out evaluation before it could be switched on; it has not been measured, so it is not done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ftfy

#: The payload fields shown to users and repaired.
DISPLAY_FIELDS = ("text", "title")


def repair_text(text: str) -> str:
    """``ftfy.fix_text`` (mojibake, HTML entities, control characters; NFC), keeping curly
    quotes as the author wrote them (ftfy would straighten them by default)."""
    return ftfy.fix_text(text, uncurl_quotes=False)


def repair_display(doc: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(payload with repaired display fields, whether any changed)``; other fields untouched."""
    out = dict(doc)
    changed = False
    for key in DISPLAY_FIELDS:
        value = out.get(key)
        if isinstance(value, str):
            fixed = repair_text(value)
            if fixed != value:
                out[key] = fixed
                changed = True
    return out, changed
