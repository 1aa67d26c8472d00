"""Experiment arms: deterministic across processes, faithful to the shares, reshuffled by the salt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from esp_retrieval.service.tuning import Registry
from esp_retrieval.service.tuning.assignment import bucket, pick, traffic_bucket
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
N_UNITS = 100_000
SHARES = {"control": 0.5, "entity": 0.3, "intent": 0.2}


def _registry(salt: str = "exp-salt-1", shares: dict[str, float] = SHARES, **extra: object) -> Registry:
    return Registry.parse(
        {
            "operating_points": {
                "default": {"weights": {"semantic": 1.0}},
                "entity": {"weights": {"entity": 2.0}},
                "intent": {"weights": {"intent": 2.0}},
            },
            "experiments": {
                "exp": {
                    "salt": salt,
                    "arms": [
                        {"name": name, "share": share, "operating_point": "default" if name == "control" else name}
                        for name, share in shares.items()
                    ],
                    **extra,
                }
            },
        },
        LAYOUT,
    )


def _units(n: int = N_UNITS) -> list[str]:
    return [f"user-{i}" for i in range(n)]


_CHILD = """
import json, sys
from esp_retrieval.service.tuning import Registry
from esp_retrieval.subspace.layout import SubspaceLayout
layout = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
reg = Registry.parse(json.loads(sys.argv[1]), layout)
print(json.dumps([reg.assign("exp", f"user-{i}").name for i in range(int(sys.argv[2]))]))
"""


@pytest.mark.slow  # a second Python process
def test_assignment_is_identical_in_another_process_with_another_hash_seed() -> None:
    doc = {
        "operating_points": {"a": {"weights": {"semantic": 1.0}}, "b": {"weights": {"entity": 1.0}}},
        "experiments": {"exp": {"salt": "s1", "arms": [
            {"name": "control", "share": 0.5, "operating_point": "a"},
            {"name": "treatment", "share": 0.5, "operating_point": "b"},
        ]}},
    }
    n = 2000
    here = [Registry.parse(doc, LAYOUT).assign("exp", f"user-{i}").name for i in range(n)]
    runs = []
    for seed in ("1", "12345"):  # Python's str hash differs per seed; the arms must not
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(doc), str(n)],
            capture_output=True, text=True, check=True, env=env, timeout=120,
        )
        runs.append(json.loads(out.stdout))
    assert runs[0] == here
    assert runs[1] == here
    assert set(here) == {"control", "treatment"}


def test_bucket_is_pinned_to_sha256() -> None:
    # Golden values (first 8 bytes of sha256("salt:unit"), big-endian, / 2**64). If these change,
    # every unit of every replica moves arm: that must be a deliberate, versioned decision.
    assert bucket("salt", "unit") == 0.4032592391545091
    assert bucket("entity-weight-2026-q4-v1", "user-42") == 0.9773337067635115
    assert traffic_bucket("s", "u") == 0.5466035675432078
    assert traffic_bucket("s", "u") == bucket("s:traffic", "u")


def test_shares_match_within_one_point_over_100k_units() -> None:
    reg = _registry()
    counts = Counter(reg.assign("exp", u).name for u in _units())
    for name, share in SHARES.items():
        assert abs(counts[name] / N_UNITS - share) < 0.01, (name, counts)


def test_changed_salt_reshuffles_the_expected_fraction() -> None:
    # Independent draws: P(same arm) = sum of squared shares, so 1 - 0.38 = 62% should move.
    old, new = _registry("salt-a"), _registry("salt-b")
    units = _units()
    moved = sum(old.assign("exp", u).name != new.assign("exp", u).name for u in units) / len(units)
    expected = 1 - sum(s * s for s in SHARES.values())
    assert abs(moved - expected) < 0.01, moved
    # ... and the same salt moves nobody.
    again = _registry("salt-a")
    assert all(old.assign("exp", u) == again.assign("exp", u) for u in units[:5000])


def test_traffic_fraction_excludes_units_into_the_default_arm_and_ramping_keeps_arms() -> None:
    units = _units(20_000)
    low = _registry(traffic=0.2, default_arm="control")
    high = _registry(traffic=0.6, default_arm="control")
    full = _registry()
    a_low = [low.assignment("exp", u) for u in units]
    a_high = [high.assignment("exp", u) for u in units]
    assert abs(sum(a.included for a in a_low) / len(units) - 0.2) < 0.015
    assert abs(sum(a.included for a in a_high) / len(units) - 0.6) < 0.015
    assert all(a.arm.name == "control" for a in a_low if not a.included)
    for u, lo, hi in zip(units, a_low, a_high, strict=True):
        if lo.included:  # ramping up only adds units; an included unit keeps its arm
            assert hi.included
            assert lo.arm == hi.arm == full.assign("exp", u)


def test_disabled_experiment_serves_everyone_the_default_arm() -> None:
    reg = _registry(enabled=False, default_arm="entity")
    got = {reg.assignment("exp", u) for u in _units(500)}
    assert {(a.arm.name, a.included) for a in got} == {("entity", False)}


def test_pick_covers_the_unit_interval() -> None:
    shares = [0.25, 0.25, 0.5]
    assert pick(shares, 0.0) == 0
    assert pick(shares, 0.2499999) == 0
    assert pick(shares, 0.25) == 1
    assert pick(shares, 0.5) == 2
    assert pick(shares, 0.9999999999) == 2
    # shares that sum to 1 - 1e-10 still place the top of the interval in the last arm
    assert pick([0.3, 0.7 - 1e-10], 1 - 1e-12) == 1
    assert pick([1.0], 0.7) == 0
