"""Config from YAML + env overrides with clear errors; the frozen-feature cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from esp_retrieval.training.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_demo_config_loads_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(REPO / "configs" / "demo.yaml")
    assert [o.name for o in cfg.objectives] == ["semantic", "entity", "intent"]
    assert (cfg.trunk.mode, cfg.weighting.name, cfg.surgery.name) == ("frozen", "equal", "sum")
    assert cfg.split.heldout_year == "dl20"
    monkeypatch.setenv("ESP_TRAIN_OPTIM__STEPS", "7")
    monkeypatch.setenv("ESP_TRAIN_TRUNK__MODE", "top:2")
    cfg = load_config(REPO / "configs" / "demo.yaml")
    assert cfg.optim.steps == 7 and cfg.trunk.mode == "top:2" and cfg.optim.lr == 0.001


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("objectives: []\nbogus: 1\n", "bogus"),
        (
            "objectives:\n - {name: a, dim: 4, data: semantic, loss: hinge}\n",
            "allowed: ['bce', 'cross_entropy'",
        ),
        ("objectives:\n - {name: a, dim: 4, data: semantic, loss: mse}\ntrunk: {mode: top:x}\n", "top:N"),
        (
            "objectives:\n - {name: a, dim: 4, data: semantic, loss: mse}\nsurgery: {name: cagrad}\n",
            "allowed: ['pcgrad', 'sum']",
        ),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text, "utf-8")
    with pytest.raises((ValidationError, ValueError)) as err:
        load_config(path)
    assert message in str(err.value)


def test_feature_cache_hit_miss_and_atomic(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from esp_retrieval.training.features import pooled_features
    from esp_retrieval.training.model import Trunk, TrunkMode

    trunk = Trunk.from_pretrained(tiny_bert_dir, max_length=32, mode=TrunkMode.parse("frozen"))
    texts = ["cost of concrete", "flea life cycle", "the"]
    a = pooled_features(trunk, texts, tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].endswith(".npy")  # no temporary file left behind
    np.testing.assert_array_equal(np.load(tmp_path / files[0]), a)
    np.save(tmp_path / files[0], np.zeros_like(a))  # a hit reads the cache instead of recomputing
    np.testing.assert_array_equal(pooled_features(trunk, texts, tmp_path), 0.0)
    (tmp_path / files[0]).write_bytes(b"")  # a corrupt entry is recomputed and rewritten
    np.testing.assert_allclose(pooled_features(trunk, texts, tmp_path), a, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / files[0]), a, atol=1e-6)
    b = pooled_features(trunk, [*texts, "new"], tmp_path)  # different texts -> different key
    np.testing.assert_allclose(b[:3], a, atol=1e-6)
    assert len(list(tmp_path.iterdir())) == 2
    trunk.max_length = 2  # another tokenisation -> another key
    pooled_features(trunk, texts, tmp_path)
    assert len(list(tmp_path.iterdir())) == 3


def test_feature_cache_chunks_are_shared_and_resumable(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from esp_retrieval.training import features
    from esp_retrieval.training.model import Trunk, TrunkMode

    monkeypatch.setattr(features, "CHUNK", 2)
    trunk = Trunk.from_pretrained(tiny_bert_dir, max_length=32, mode=TrunkMode.parse("frozen"))
    texts = ["a cost", "b flea", "c life", "d cycle", "e the"]
    full = features.pooled_features(trunk, texts, tmp_path)
    assert len(list(tmp_path.glob("*.npy"))) == 3  # chunks of 2, 2, 1
    calls = []
    real = trunk.encode
    monkeypatch.setattr(trunk, "encode", lambda t, **kw: calls.append(list(t)) or real(t, **kw))
    again = features.pooled_features(trunk, [*texts[:4], "other"], tmp_path)
    assert calls == [["other"]]  # the first two chunks came from the cache
    np.testing.assert_array_equal(again[:4], full[:4])


def test_readonly_folders_are_read_first_and_never_written(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from esp_retrieval.training.features import pooled_features
    from esp_retrieval.training.model import Trunk, TrunkMode

    trunk = Trunk.from_pretrained(tiny_bert_dir, max_length=32, mode=TrunkMode.parse("frozen"))
    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    texts = ["cost of concrete", "flea life cycle"]
    a = pooled_features(trunk, texts, shipped)
    (entry,) = shipped.iterdir()
    np.save(entry, a + 1.0)  # marks the shipped entry: a hit returns it
    got = pooled_features(trunk, texts, cache, readonly=[tmp_path / "missing", shipped])
    np.testing.assert_array_equal(got, a + 1.0)
    assert not cache.exists()  # a hit is not copied into the writable cache
    b = pooled_features(trunk, ["new text"], cache, readonly=[shipped])
    assert [p.name for p in shipped.iterdir()] == [entry.name]  # misses never go to a read-only folder
    np.testing.assert_array_equal(np.load(next(cache.iterdir())), b)


def test_esp_features_writes_a_corpus_then_reuses_it(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from esp_retrieval.cli.main import main
    from esp_retrieval.training.features import pooled_features
    from esp_retrieval.training.model import Trunk, TrunkMode

    texts = ["cost of concrete", "flea life cycle", "who is robert gray"]
    corpus = tmp_path / "docs.tsv"
    corpus.write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(texts)), "utf-8")
    monkeypatch.setenv("ESP_TRAIN_TRUNK__PATH", str(tiny_bert_dir))
    monkeypatch.setenv("ESP_TRAIN_TRUNK__MAX_LENGTH", "32")
    monkeypatch.setenv("ESP_TRAIN_EXPORT__CORPUS", str(corpus))
    out = tmp_path / "features"
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert main(["features", "--config", str(demo), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["shape"][0] == 3
    (entry,) = out.glob("*.npy")
    trunk = Trunk.from_pretrained(tiny_bert_dir, max_length=32, mode=TrunkMode.parse("frozen"))
    np.testing.assert_allclose(np.load(entry), pooled_features(trunk, texts), atol=1e-6)
    monkeypatch.setattr(Trunk, "encode", lambda *a, **k: pytest.fail("recomputed a stored chunk"))
    assert main(["features", "--config", str(demo), "--out", str(out)]) == 0
    assert main(["features", "--config", str(tmp_path / "nope.yaml"), "--out", str(out)]) == 2
    assert main(["features", "--config", str(demo), "--out", str(corpus)]) == 2  # a file, not a folder
    assert "not a folder" in capsys.readouterr().err
