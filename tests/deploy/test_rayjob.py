"""k8s-ray/rayjob-esp-index.yaml: a RayJob valid against the CRD schema whose pods are valid core
pods, whose entrypoint is an `esp index --engine ray` command the CLI accepts, with the shard work
folder on storage every pod mounts, and the Ray version the project pins."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy.files import REPO_ROOT
from tests.deploy.rayjob_schema import RAYJOB, pod_templates
from tests.deploy.support import KUBE_VERSIONS
from tests.deploy.test_manifests import YAMLLINT

MANIFEST = REPO_ROOT / "k8s-ray" / "rayjob-esp-index.yaml"


def _doc() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))


def _validate(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    jsonschema.Draft7Validator(RAYJOB).validate(doc)
    for where, template in pod_templates(doc).items():
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(pod, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{where}: {exc}") from exc


def test_rayjob_validates_strictly() -> None:
    _validate(_doc())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"].update(shutdownAfterJobFinish=True),  # misspelt
        lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda d: d["spec"].update(submissionMode="K8sMode"),
        lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(
            ports="6379"),
        lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"].update(volume=[]),
    ],
    ids=["misspelt-field", "group-without-name", "bad-submission-mode", "ports-not-a-list", "bad-pod-field"],
)
def test_validation_is_strict(mutate) -> None:
    doc = copy.deepcopy(_doc())
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, AssertionError)):
        _validate(doc)


def test_entrypoint_is_an_esp_index_ray_command_on_shared_storage() -> None:
    from esp_retrieval.cli import index

    doc = _doc()
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[:4] == ["python", "-m", "esp_retrieval.cli", "index"]
    import argparse

    parser = argparse.ArgumentParser()
    index.add_arguments(parser)
    args = parser.parse_args(argv[4:])
    assert args.engine == "ray" and args.work_dir is not None
    mounts = {}
    for where, template in pod_templates(doc).items():
        (c,) = template["spec"]["containers"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"]}
        mounts[where] = {(claims[m["name"]], m["mountPath"]) for m in c["volumeMounts"]}
    shared = set.intersection(*mounts.values())
    for path in (args.work_dir, args.bundle, args.corpus, args.out):
        assert any(Path(path).is_relative_to(mount) for _, mount in shared), path


def test_ray_version_is_the_pinned_one_and_head_does_no_encoding() -> None:
    doc = _doc()
    pins = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    assert f"ray[data]=={doc['spec']['rayClusterSpec']['rayVersion']}\n" in pins
    assert doc["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpu = [g for g in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (c,) = gpu[0]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_yaml_lints() -> None:
    from yamllint import linter

    problems = list(linter.run(MANIFEST.read_text(encoding="utf-8"), YAMLLINT, str(MANIFEST)))
    assert not problems, [str(p) for p in problems]
