"""The registry watcher: hot reload, ConfigMap symlink swaps, bad files kept out and counted."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from esp_retrieval.service.metrics import Metrics
from esp_retrieval.service.tuning import RegistryError, RegistryWatcher
from esp_retrieval.subspace.bundle import read_bundle, write_bundle
from esp_retrieval.subspace.layout import SubspaceLayout

LAYOUT = SubspaceLayout.from_dims({"semantic": 16, "entity": 8, "intent": 8})
BUNDLE_POINTS = {"semantic_first": {"weights": {"semantic": 1.0, "entity": 0.0, "intent": 0.0},
                                    "description": "from training", "metrics": {"ndcg@10": 0.7}}}


def _doc(entity: float = 0.8, salt: str = "s1") -> dict:
    return {
        "operating_points": {
            "balanced": {"weights": {"semantic": 1.0, "entity": 1.0, "intent": 1.0}},
            "entity_heavy": {"weights": {"semantic": 0.2, "entity": entity}},
        },
        "experiments": {"ent": {"salt": salt, "arms": [
            {"name": "control", "share": 0.5, "operating_point": "balanced"},
            {"name": "treatment", "share": 0.5, "operating_point": "entity_heavy"},
        ]}},
    }


def _text(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def _count(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("esp_registry_reloads_total", {"result": result})
    assert value is not None
    return value


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def _watcher(path: Path | None, metrics: Metrics) -> RegistryWatcher:
    w = RegistryWatcher(path, metrics, poll_seconds=0.05)
    w.set_layout(LAYOUT, BUNDLE_POINTS)
    return w


def test_a_valid_change_is_picked_up_without_a_restart(tmp_path: Path, metrics: Metrics) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc(entity=0.8)))
    w = _watcher(path, metrics)
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.8
    assert set(w.current.operating_points) == {"semantic_first", "balanced", "entity_heavy"}
    assert _count(metrics, "success") == 1
    assert w.check_now() is False  # unchanged: nothing re-installed, nothing counted
    path.write_text(_text(_doc(entity=0.9)))
    assert w.check_now() is True
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.9
    assert _count(metrics, "success") == 2
    assert _count(metrics, "failure") == 0


INVALID = {
    "unknown subspace": _text({"operating_points": {"p": {"weights": {"topic": 1.0}}}}),
    "shares not summing to 1": _text(_doc()).replace("share: 0.5", "share: 0.4", 1),
    "negative weight": _text(_doc(entity=-0.5)),
    "unknown operating point in an arm": _text(_doc()).replace(
        "operating_point: entity_heavy", "operating_point: entity_max"
    ),
    "malformed file": "operating_points: {balanced: [\n",
    "unknown key": _text(_doc()).replace("salt:", "sallt:"),
    "empty file": "",
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_registry_is_rejected_the_old_one_kept_and_counted(
    case: str, tmp_path: Path, metrics: Metrics
) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc()))
    w = _watcher(path, metrics)
    good = w.current
    path.write_text(INVALID[case])
    assert w.check_now() is False
    assert w.current is good
    assert _count(metrics, "failure") == 1
    assert w.last_error is not None
    assert str(path) in w.last_error
    # the same bad content is counted once, not once per poll
    assert w.check_now() is False
    assert _count(metrics, "failure") == 1
    # and the service still resolves with the old registry
    assert w.current.resolve(LAYOUT, operating_point="entity_heavy").weights_used["entity"] == 0.8
    path.write_text(_text(_doc(entity=0.3)))
    assert w.check_now() is True
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.3
    assert w.last_error is None
    assert _count(metrics, "success") == 2


def _configmap_write(mount: Path, files: dict[str, str], stamp: str) -> None:
    """What the kubelet's atomic writer does: new timestamped dir, then rename ``..data`` onto it."""
    new = mount / f"..{stamp}"
    new.mkdir()
    for name, content in files.items():
        (new / name).write_text(content)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    tmp = mount / "..data_tmp"
    tmp.symlink_to(new.name)
    os.replace(tmp, mount / "..data")
    for name in files:
        if not (mount / name).is_symlink():
            (mount / name).symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(mount / old)


def test_configmap_symlink_swap_is_detected_even_with_same_size_and_mtime(
    tmp_path: Path, metrics: Metrics
) -> None:
    mount = tmp_path / "registry"
    mount.mkdir()
    first, second = _text(_doc(entity=0.8)), _text(_doc(entity=0.7))
    assert len(first) == len(second)
    _configmap_write(mount, {"registry.yaml": first}, "2026_11_30_01")
    path = mount / "registry.yaml"
    w = _watcher(path, metrics)
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.8
    stat = path.stat()
    _configmap_write(mount, {"registry.yaml": second}, "2026_11_30_02")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: only content differs
    assert path.stat().st_mtime_ns == stat.st_mtime_ns
    assert path.stat().st_size == stat.st_size
    assert w.check_now() is True
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.7
    # an invalid ConfigMap update is kept out the same way
    _configmap_write(mount, {"registry.yaml": INVALID["negative weight"]}, "2026_11_30_03")
    assert w.check_now() is False
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.7
    assert (_count(metrics, "success"), _count(metrics, "failure")) == (2, 1)


def test_missing_file_serves_bundle_points_then_appears_then_disappears(
    tmp_path: Path, metrics: Metrics
) -> None:
    path = tmp_path / "registry.yaml"
    w = _watcher(path, metrics)
    assert set(w.current.operating_points) == {"semantic_first"}
    assert not w.current.experiments
    assert _count(metrics, "failure") == 0  # not configured yet is not a failed reload
    assert w.check_now() is False
    path.write_text(_text(_doc()))
    assert w.check_now() is True
    assert "ent" in w.current.experiments
    path.unlink()
    assert w.check_now() is False
    assert "ent" in w.current.experiments  # the last good registry stays
    assert _count(metrics, "failure") == 1
    assert w.check_now() is False
    assert _count(metrics, "failure") == 1
    path.write_text(_text(_doc(entity=0.5)))
    assert w.check_now() is True
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.5


def test_no_registry_path_means_bundle_points_only(metrics: Metrics) -> None:
    w = _watcher(None, metrics)
    assert set(w.current.operating_points) == {"semantic_first"}
    assert w.check_now() is False
    assert (_count(metrics, "success"), _count(metrics, "failure")) == (0, 0)


def test_check_now_before_a_bundle_does_nothing(tmp_path: Path, metrics: Metrics) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc()))
    w = RegistryWatcher(path, metrics)
    assert w.check_now() is False
    assert not w.current.operating_points
    with pytest.raises(ValueError, match="poll_seconds"):
        RegistryWatcher(path, metrics, poll_seconds=0)


def test_experiment_label_values_are_initialised_from_the_registry(tmp_path: Path, metrics: Metrics) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc()))
    _watcher(path, metrics)
    for arm in ("control", "treatment"):
        labels = {"experiment": "ent", "arm": arm}
        assert metrics.registry.get_sample_value("esp_experiment_requests_total", labels) == 0.0
        assert metrics.registry.get_sample_value("esp_experiment_request_duration_seconds_count", labels) == 0.0
    assert metrics.registry.get_sample_value(
        "esp_experiment_requests_total", {"experiment": "ent", "arm": "other"}
    ) is None


def _bundle(root: Path, name: str, dims: dict[str, int], points: dict) -> Path:
    layout = SubspaceLayout.from_dims(dims)
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((5, layout.dim)).astype(np.float32)
    for obj in layout:  # block-normalised, as the bundle contract requires
        block = emb[:, obj.offset:obj.end]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
    out = root / name
    write_bundle(out, layout, emb, [f"d{i}" for i in range(5)], sections={"operating_points": points})
    return out


def test_set_bundle_revalidates_against_the_new_layout(tmp_path: Path, metrics: Metrics) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc()))
    first = read_bundle(_bundle(tmp_path, "b1", {"semantic": 16, "entity": 8, "intent": 8}, BUNDLE_POINTS))
    w = RegistryWatcher(path, metrics)
    w.set_bundle(first)
    assert w.current.layout == first.layout
    assert {"semantic_first", "entity_heavy"} <= set(w.current.operating_points)
    # a bundle without the entity subspace: the file no longer fits, the old registry cannot stay
    no_entity = read_bundle(_bundle(tmp_path, "b2", {"semantic": 16, "intent": 8},
                                    {"plain": {"weights": {"semantic": 1.0}}}))
    with pytest.raises(RegistryError, match="unknown subspace 'entity'"):
        w.check_bundle(no_entity)  # asked before the swap: nothing changes
    assert w.current.layout == first.layout
    w.set_bundle(no_entity)
    assert w.current.layout == no_entity.layout
    assert set(w.current.operating_points) == {"plain"}
    assert _count(metrics, "failure") == 1
    # back to a fitting bundle: the unchanged file is valid again
    w.set_bundle(first)
    assert "ent" in w.current.experiments
    assert w.check_bundle(first).operating_points.keys() == w.current.operating_points.keys()


def test_background_polling_picks_up_a_change(tmp_path: Path, metrics: Metrics) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc(entity=0.8)))
    w = _watcher(path, metrics)

    async def scenario() -> float:
        await w.start()
        await w.start()  # idempotent
        try:
            path.write_text(_text(_doc(entity=0.6)))
            for _ in range(400):  # a deadline, not a timing assertion: poll_seconds is 0.05
                if w.current.operating_points["entity_heavy"].weights["entity"] == 0.6:
                    break
                await asyncio.sleep(0.05)
        finally:
            await w.stop()
        return w.current.operating_points["entity_heavy"].weights["entity"]

    assert asyncio.run(scenario()) == 0.6
    assert not w._poller.running


def test_a_registry_edited_for_the_next_layout_does_not_block_that_bundle(
    tmp_path: Path, metrics: Metrics
) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc()))
    old = read_bundle(_bundle(tmp_path, "old", {"semantic": 16, "entity": 8, "intent": 8}, {}))
    new = read_bundle(_bundle(tmp_path, "new", {"semantic": 16, "topic": 8}, {}))
    w = RegistryWatcher(path, metrics)
    w.set_bundle(old)
    # the operator ships the registry for the new layout first: rejected while the old one serves
    path.write_text(_text({"operating_points": {"topical": {"weights": {"topic": 2.0}}}}))
    assert w.check_now() is False
    assert "ent" in w.current.experiments
    assert set(w.check_bundle(new).operating_points) == {"topical"}  # ... yet the new bundle may load
    w.set_bundle(new)
    assert set(w.current.operating_points) == {"topical"}
    assert (_count(metrics, "success"), _count(metrics, "failure")) == (2, 1)


def test_a_typo_in_the_file_does_not_block_a_bundle_the_served_registry_fits(
    tmp_path: Path, metrics: Metrics
) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(_text(_doc(entity=0.4)))
    first = read_bundle(_bundle(tmp_path, "b1", {"semantic": 16, "entity": 8, "intent": 8}, {}))
    second = read_bundle(_bundle(tmp_path, "b2", {"semantic": 16, "entity": 8, "intent": 8},
                                 {"extra": {"weights": {"intent": 3.0}}}))
    w = RegistryWatcher(path, metrics)
    w.set_bundle(first)
    path.write_text(INVALID["malformed file"])
    assert w.check_now() is False
    assert "extra" in w.check_bundle(second).operating_points
    w.set_bundle(second)
    # the registry in service, re-validated with the new bundle's points; not the bundle's alone
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.4
    assert "extra" in w.current.operating_points
    assert "ent" in w.current.experiments
    assert _count(metrics, "failure") == 1  # the malformed content, counted once


def test_a_bundle_with_invalid_operating_points_fails_the_check(tmp_path: Path, metrics: Metrics) -> None:
    bad = read_bundle(_bundle(tmp_path, "bad", {"semantic": 16, "entity": 8},
                              {"p": {"weights": {"semantic": -1.0}}}))
    w = RegistryWatcher(None, metrics)
    with pytest.raises(RegistryError, match=r"bundle manifest: operating_points\.p\.weights\.semantic"):
        w.check_bundle(bad)
    w.set_bundle(bad)  # if served anyway, it serves no operating points rather than bad ones
    assert not w.current.operating_points
    assert w.current.layout == bad.layout
    assert _count(metrics, "failure") == 1


def test_readers_see_whole_registries_while_configmap_swaps_race_the_polls(
    tmp_path: Path, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    mount = tmp_path / "registry"
    mount.mkdir()
    contents = [_text(_doc(entity=0.8)), _text(_doc(entity=0.7)), INVALID["negative weight"]]
    _configmap_write(mount, {"registry.yaml": contents[0]}, "0000")
    w = _watcher(mount / "registry.yaml", metrics)
    stop = threading.Event()
    errors: list[BaseException] = []

    def swapper() -> None:
        try:
            for i in range(1, 60):
                _configmap_write(mount, {"registry.yaml": contents[i % 3]}, f"{i:04d}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def poller() -> None:
        try:
            while not stop.is_set():
                w.check_now()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=swapper), threading.Thread(target=poller)]
    for t in threads:
        t.start()
    seen = set()
    while not stop.is_set():
        r = w.current.resolve(LAYOUT, operating_point="entity_heavy")
        seen.add(r.weights_used["entity"])
    for t in threads:
        t.join()
    assert not errors
    assert seen <= {0.8, 0.7}
    _configmap_write(mount, {"registry.yaml": contents[1]}, "9999")
    w.check_now()
    assert w.current.operating_points["entity_heavy"].weights["entity"] == 0.7
    # a swap is never mistaken for a vanished file
    assert not [r for r in caplog.records if "disappeared" in r.getMessage() or "not found" in r.getMessage()]
