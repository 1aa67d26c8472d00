"""``torchrun --nproc_per_node 2`` on the tiny BERT: ranks stay identical and match one process.

The reference is :class:`esp_retrieval.training.distributed.ShardAccumulatingTrainer`: one process, the same
global batches (both ranks' shards), their gradients averaged before PCGrad.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.ddp_worker import ddp_config, flat_params

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a Ray cluster / torchrun processes per module
STEPS = 4


def _torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # PYTHONFAULTHANDLER: a rank killed by a signal prints where its Python was
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _failure(stderr: str) -> str:
    """The ranks' stderr without progress bars: what a failed torchrun shows."""
    return "\n".join(x for x in stderr.splitlines() if "%|" not in x)[-6000:]


def _reference(cfg, world: int) -> tuple[list[np.ndarray], list[dict]]:
    from esp_retrieval.training.distributed import ShardAccumulatingTrainer
    from esp_retrieval.training.run import build_run
    from esp_retrieval.training.trainer import Trainer

    parts = build_run(cfg, features_cache=None)
    tr = ShardAccumulatingTrainer(parts, cfg, world, progress=False) if world > 1 else Trainer(
        parts, cfg, progress=False)
    opt, schedule = tr.optimizer()
    tr.model.train()
    params, records = [], []
    for step in range(1, STEPS + 1):
        records.append(tr.step(step, opt))
        schedule.step()
        params.append(flat_params(tr.model).numpy().copy())
    return params, records


@pytest.fixture(scope="module")
def ddp_run(tiny_data_dir: Path, tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("ddp") / "run.npz"
    args = (str(ROOT / "tests" / "training" / "ddp_worker.py"), "--data-dir", str(tiny_data_dir),
            "--bert-dir", str(tiny_bert_dir), "--steps", str(STEPS), "--out", str(out))
    proc = _torchrun(*args)
    if proc.returncode != 0 and "(SIGABRT)" in proc.stderr:
        # once in CI a rank died of SIGABRT inside gloo ("terminate called without an active exception"),
        # not reproduced in 14 runs here, loaded or not; the job runs once more, in a fresh torchrun (an
        # elastic restart reuses the store and can hang), and its result must still match the reference
        warnings.warn(f"a torchrun rank died of SIGABRT; running the job again:\n{_failure(proc.stderr)[-3000:]}",
                      stacklevel=1)
        proc = _torchrun(*args)
    assert proc.returncode == 0, _failure(proc.stderr)
    params = np.load(out)["params"]  # (steps, world, P)
    records = json.loads(out.with_suffix(".json").read_text("utf-8"))
    return params, records


def test_ranks_hold_identical_parameters_after_every_step(ddp_run) -> None:
    params, _ = ddp_run
    assert params.shape[:2] == (STEPS, 2)
    for step in range(STEPS):
        assert np.array_equal(params[step, 0], params[step, 1]), f"ranks differ after step {step + 1}"
    assert not np.array_equal(params[0, 0], params[-1, 0])  # it trained


def test_two_ranks_equal_one_process_on_the_same_global_batches(
    ddp_run, tiny_data_dir: Path, tiny_bert_dir: Path
) -> None:
    params, records = ddp_run
    cfg = ddp_config(str(tiny_data_dir), str(tiny_bert_dir), STEPS)
    torch.set_num_threads(1)
    ref_params, ref_records = _reference(cfg, world=2)
    for step in range(STEPS):
        np.testing.assert_allclose(params[step, 0], ref_params[step], atol=1e-5, rtol=0,
                                   err_msg=f"step {step + 1}")
    for got, want in zip(records, ref_records, strict=True):
        assert [p["projected"] for p in got["pairs"]] == [p["projected"] for p in want["pairs"]]
        for name, v in want["tasks"].items():
            # the records round lambda to 6 decimals: two values a float error apart can round to
            # neighbours (1.0759805 -> 1.075981 and 1.07598), so one unit of the last place is allowed
            assert got["tasks"][name]["lambda"] == pytest.approx(v["lambda"], abs=1.5e-6)
            assert got["tasks"][name]["loss"] == pytest.approx(v["loss"], abs=1e-5)
    # the check has teeth: PCGrad projected, DWA moved the weights, and a lone rank-0 run differs
    assert any(p["projected"] for r in records for p in r["pairs"])
    assert any(v["lambda"] != 1.0 for v in records[-1]["tasks"].values())
    alone, _ = _reference(cfg, world=1)
    assert np.abs(alone[0] - params[0, 0]).max() > 1e-4


def test_esp_train_under_torchrun_rank0_writes_once(tiny_data_dir: Path, tiny_bert_dir: Path, tmp_path: Path) -> None:
    import yaml

    cfg = ddp_config(str(tiny_data_dir), str(tiny_bert_dir), 3)
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()), "utf-8")
    out = tmp_path / "out"
    proc = _torchrun("-m", "esp_retrieval.cli", "train", "--config", str(config), "--out", str(out), "--no-progress")
    # 3 steps need not improve every metric: rank 0 then exits 3, and torchrun exits 1 naming it
    assert proc.returncode == 0 or "exitcode  : 3" in proc.stderr, _failure(proc.stderr)
    steps = [json.loads(x) for x in (out / "train_log.jsonl").read_text("utf-8").splitlines()]
    assert [r["step"] for r in steps if "tasks" in r] == [1, 2, 3]
    assert proc.stdout.count('"improved"') == 1  # one summary: rank 0's
    assert json.loads((out / "metrics.json").read_text("utf-8"))["final"]
