"""bench/intent_cv.py trains the eval's own runs: a candidate changes only what it names."""

from __future__ import annotations

from pathlib import Path

from bench.intent_cv import _candidate, _training_dict
from esp_retrieval.training.evaluate.config import load_eval_config

ROOT = Path(__file__).resolve().parents[2]


def test_a_candidate_merges_into_the_intent_objective_only() -> None:
    cfg = load_eval_config(ROOT / "configs" / "eval.yaml")
    name, over = _candidate('bs8={"intent": {"batch_size": 8}, "cosine_scale": 8}')
    assert name == "bs8"
    base = cfg.training_dict("esp_sparse", seed=1, heldout_year="dl19", intent_fold=3)
    d = _training_dict(cfg, "esp_sparse", (1, "dl19", 3), over)
    by_name = {o["name"]: o for o in d["objectives"]}
    assert by_name["intent"]["batch_size"] == 8
    assert by_name["intent"]["head"] == next(o for o in base["objectives"] if o["name"] == "intent")["head"]
    assert [o for o in d["objectives"] if o["name"] != "intent"] == [
        o for o in base["objectives"] if o["name"] != "intent"]
    assert d["cosine_scale"] == 8
    assert d["seed"] == 1
    assert d["split"] == base["split"]  # the eval's year and fold
    assert d["eval"]["enabled"] is False and d["export"] == {"enabled": False}


def test_no_candidate_is_the_eval_config() -> None:
    cfg = load_eval_config(ROOT / "configs" / "eval.yaml")
    d = _training_dict(cfg, "esp", (0, "dl20", 0), {})
    base = cfg.training_dict("esp", seed=0, heldout_year="dl20", intent_fold=0)
    assert d["objectives"] == base["objectives"] and d["optim"] == base["optim"]
