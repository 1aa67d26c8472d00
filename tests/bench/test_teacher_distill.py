"""bench/teacher_distill.py: the training queries never hold an evaluation query or a near duplicate."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.teacher_distill import TOPIC_FILES, main, training_queries


def test_training_queries_drop_held_out_queries_near_duplicates_and_repeats(tmp_path: Path) -> None:
    lines = {
        TOPIC_FILES[0]: ["1\twhat is a cat", "2\tWhat is  a CAT ?", "3\thow tall is mount everest"],
        TOPIC_FILES[1]: ["4\thow tall is mount everest", "5\tcauses of the french revolution"],
        TOPIC_FILES[2]: ["6\twhat are the causes of the french revolution", "bad line without a tab"],
        TOPIC_FILES[3]: ["7\tdefine photosynthesis"],
    }
    for name, rows in lines.items():
        (tmp_path / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    held_out = ["what is a cat", "causes of the French revolution"]
    rows = training_queries(tmp_path, held_out, near=0.8)
    texts = [t for _, _, t in rows]
    # 1 and 2 are the held-out query (2 by its tokens), 4 repeats 3, 5 is held out; 6 shares
    # 5 of 7 tokens with it (Jaccard 0.71 < 0.8): kept
    assert texts == ["how tall is mount everest", "what are the causes of the french revolution", "define photosynthesis"]
    assert [(src, qid) for src, qid, _ in rows] == [
        ("msmarco-passage.dev-subset", "3"), ("msmarco-doc.dev", "6"), ("msmarco-doc.test", "7")
    ]


def test_help_names_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(cmd in out for cmd in ("encode", "train"))
