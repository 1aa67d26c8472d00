"""Display text is repaired with ftfy at indexing (docs.jsonl); the embedded text is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from esp_retrieval.cli.main import main
from esp_retrieval.subspace.bundle import read_bundle
from esp_retrieval.training.display_text import repair_display, repair_text

MOJIBAKE = "Europeâ€™s largest banks â€“ a list"
FIXED = "Europe’s largest banks – a list"


def test_repair_fixes_mojibake_and_leaves_clean_text_alone() -> None:
    assert repair_text(MOJIBAKE) == FIXED
    assert repair_text("caf&eacute; na\u00efve") == "café naïve"
    clean = {"text": "plain text", "title": "A title", "url": "http://x/â€™", "n": 3}
    assert repair_display(clean) == (clean, False)  # the url is not display text
    fixed, changed = repair_display({"text": MOJIBAKE, "title": "Europeâ€™s", "url": "u"})
    assert changed and fixed == {"text": FIXED, "title": "Europe’s", "url": "u"}


def test_esp_index_repairs_docs_but_embeds_the_corpus_text(tiny_bundle: Path, tmp_path: Path, capsys) -> None:
    from esp_retrieval.encoder.query_encoder import QueryEncoder

    rows = [("d1", MOJIBAKE), ("d2", "a clean passage about rivers")]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t, "title": t[:10]}) + "\n" for i, t in rows), "utf-8")
    out = tmp_path / "indexed"
    assert main(["index", "--bundle", str(tiny_bundle), "--corpus", str(corpus), "--out", str(out),
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    b = read_bundle(out)
    docs = list(b.docs())
    assert docs[0]["text"] == FIXED and docs[0]["title"] == "Europe’s"  # MOJIBAKE[:10]
    assert docs[1]["text"] == rows[1][1]
    assert b.manifest["index"]["display_repaired"] == 1
    assert summary.get("display_repaired", 1) == 1
    enc = QueryEncoder.load(tiny_bundle / "encoder")
    raw = enc.encode([t for _, t in rows])
    np.testing.assert_allclose(np.asarray(b.embeddings), raw, atol=1e-5)  # the corpus's own text
    assert not np.allclose(enc.encode([FIXED])[0], raw[0], atol=1e-5)  # so repairing it would differ


def test_the_training_export_repairs_the_docs_it_is_given(tiny_model, tmp_path: Path) -> None:
    """``Trainer.export`` passes ``docs=`` itself (the demo bundle's path): those are repaired too."""
    from esp_retrieval.training.export import export_bundle

    texts = [MOJIBAKE, "a clean passage about rivers"]
    out = export_bundle(tmp_path / "b", tiny_model, ["d1", "d2"], texts,
                        docs=({"text": t, "title": t[:10]} for t in texts))
    docs = list(read_bundle(out).docs())
    assert docs == [{"text": FIXED, "title": "Europe’s"}, {"text": texts[1], "title": texts[1][:10]}]
    raw = tiny_model.encode(texts)
    np.testing.assert_allclose(np.asarray(read_bundle(out).embeddings), raw, atol=1e-5)  # embedded as given
