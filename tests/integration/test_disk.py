"""A full disk under the ledger, the checkpoints or the job's events: reported as events, and training
goes on to the uninterrupted run's model; an unreadable newest checkpoint is skipped at a restart."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.jobdir import job_dir, make_job_dir
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import max_param_rel_diff

from .conftest import EXAMPLE, STEPS, TOLERANCE, Runner

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def test_a_full_disk_under_ledger_and_checkpoints_is_reported_and_training_goes_on(
    runner: Runner, reference: dict[str, torch.Tensor], full_disk: Path
) -> None:
    res = runner("disk-full", ledger_dir=full_disk / "ledger", checkpoint_dir=full_disk / "ckpt", checkpoint_every=4)
    assert res.result.ok, res.result.reason
    assert max_param_rel_diff(torch.load(res.model_path), reference) <= TOLERANCE  # type: ignore[attr-defined]
    ledger = {e["worker"] for e in res.events_of("ledger_failed")}
    assert ledger == {f"local{i}:0:0" for i in range(1, 5)}, "each worker reports its own ledger once"
    failed = res.events_of("checkpoint_failed")
    assert failed and all("No space left" in e["error"] for e in failed)
    assert not [p for p in (full_disk / "ckpt").iterdir()], "no partial checkpoint left behind"


def test_a_full_disk_under_the_job_events_does_not_stop_the_coordinator(
    corpus: Path, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    directory = make_job_dir(job_dir("events-full", tmp_path))
    (directory / "events.jsonl").symlink_to("/dev/full")  # every append fails with ENOSPC
    model = tmp_path / "model.pt"
    command = [sys.executable, str(EXAMPLE), "--data", str(corpus), "--steps", str(STEPS), "--save", str(model)]
    config = JobConfig(
        job_id="events-full", nodes=3, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0,
        progress_interval_s=0.1, reduce_dtype="float64",
    )  # fmt: skip
    job = LocalJob(command, config, root=tmp_path, log_dir=tmp_path / "logs").start()
    try:
        result = job.wait(timeout=240)
        assert job.coordinator is not None
        kinds = [e["event"] for e in job.coordinator.coordinator.events.all()]
    finally:
        job.stop()
    assert result.ok, result.reason
    assert kinds.count("events_write_failed") == 1 and "job_finished" in kinds and "progress" in kinds
    assert max_param_rel_diff(torch.load(model), reference) <= TOLERANCE


def test_a_restart_skips_an_unreadable_newest_checkpoint(
    runner: Runner, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    first = runner("ckpt-first", steps=8, checkpoint_dir=ckpt, checkpoint_every=4, ledger_dir=tmp_path / "l1")
    assert first.result.ok and (ckpt / "step-000000008.pt").exists()
    (ckpt / "step-000000012.pt").write_bytes(os.urandom(4096))  # torn by a crash mid-write
    res = runner("ckpt-resume", checkpoint_dir=ckpt, checkpoint_every=0, ledger_dir=tmp_path / "l2")
    assert res.result.ok, res.result.reason
    skipped = res.events_of("checkpoint_skipped")
    assert skipped and skipped[0]["path"].endswith("step-000000012.pt")
    assert max_param_rel_diff(torch.load(res.model_path), reference) <= TOLERANCE  # type: ignore[attr-defined]
