"""bench/filter_cost.py --quick on the tiny data: one JSON line, both sides agree on the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import filter_cost


def test_filter_cost_prints_one_json_line_and_both_sides_agree(
    tiny_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert filter_cost.main(["--quick", "--values", "64", "--data", str(tiny_data_dir)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["masks_agree"] is True and r["matched_rows"] > 0 and r["in_values"] == 64
    assert r["inferred_text_type"] == "text" and r["old"]["column_dtype"].startswith("<U")
    assert r["new"]["table_bytes"] > 0 and r["old"]["ms"]["median"] >= 0
