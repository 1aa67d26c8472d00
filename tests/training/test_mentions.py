"""Entity mentions: whole-word, case-insensitive occurrences of each name, as a brute force finds them."""

from __future__ import annotations

from esp_retrieval.training.data.dlhard import find_mentions, name_mentions

PASSAGES = [
    "Robert Gray sailed the Columbia River.",
    "Kenneth Gray, not Robert; and graystone is a rock.",
    "AT&T bought it. Contact at&t support or att.",
    "St. Louis and st.louis and STL",
    "the C++ book\nnew\nyork times",
    "gray",
    "",
    "Ünïcode gray-zone and café gray",
]
NAMES = ["gray", "robert gray", "at&t", "st. louis", "c++", "new york", "graystone", "café", "columbia", "x"]


def _brute(name: str, text: str) -> bool:
    t = text.lower().replace("\n", " ")
    for i in range(len(t) - len(name) + 1):
        end = i + len(name)
        if t.startswith(name, i) and (i == 0 or not t[i - 1].isalnum()) and (
            end == len(t) or not t[end].isalnum()
        ):
            return True
    return False


def test_name_mentions_equal_a_brute_force_scan() -> None:
    got = name_mentions(NAMES, PASSAGES)
    assert got == {n: {i for i, p in enumerate(PASSAGES) if _brute(n, p)} for n in NAMES}
    assert got["gray"] == {0, 1, 5, 7}  # "Gray," and "gray-zone" count, "graystone" alone does not
    assert 0 in got["robert gray"] and 1 not in got["robert gray"]
    assert got["new york"] == {4}  # a newline inside a passage is a space
    assert got["st. louis"] == {3} and got["x"] == set()


def test_find_mentions_per_query_is_the_sorted_union() -> None:
    assert find_mentions([("gray", "c++"), ("x",), ()], PASSAGES) == [[0, 1, 4, 5, 7], [], []]
