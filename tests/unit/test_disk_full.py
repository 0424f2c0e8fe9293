"""A full disk (events, disaster-recovery checkpoints) is reported, never fatal, and leaves no partial files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slurm_elastic.events import EventLog
from slurm_elastic.worker.checkpoints.checkpoint import CheckpointWriter, DisasterRecovery, load_latest
from slurm_elastic.worker.checkpoints.state import Snapshot
from slurm_elastic.worker.replicated.replica import Replica


def test_events_that_cannot_be_written_are_reported_once_and_kept_in_memory(full_disk: Path) -> None:
    events = EventLog("job", full_disk / "events.jsonl")
    for step in range(3):
        events.emit("progress", step=step)
    kinds = [e["event"] for e in events.all()]
    assert kinds == ["progress", "events_write_failed", "progress", "progress"]
    failed = events.all()[1]
    assert "No space left" in failed["error"] and failed["lost"] == "progress"


def test_a_checkpoint_that_cannot_be_written_leaves_no_partial_file(full_disk: Path) -> None:
    writer = CheckpointWriter(full_disk / "ckpt", background=False)
    writer.save(10, Snapshot({"x": {"__t__": 0}}, [torch.zeros(100_000)]))
    error = writer.take_error()
    assert isinstance(error, OSError) and writer.take_error() is None
    assert [p.name for p in (full_disk / "ckpt").iterdir()] == []


def replica() -> Replica:
    model = torch.nn.Linear(300, 300)
    return Replica(model, torch.optim.SGD(model.parameters(), lr=0.1), None)


def test_disaster_recovery_reports_a_failed_background_write(full_disk: Path) -> None:
    reports: list[tuple[str, dict[str, Any]]] = []
    dr = DisasterRecovery(full_disk / "ckpt", every=1, background=True, report=lambda k, f: reports.append((k, f)))
    r = replica()
    r.commit(1, 8)
    dr.after_commit(r, rank=0)
    dr.close()
    assert [k for k, _ in reports] == ["checkpoint_failed"]
    assert "No space left" in reports[0][1]["error"]


def test_an_unreadable_newest_checkpoint_is_skipped_with_a_report(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path, keep=5, background=False)
    writer.save(4, replica().capture())
    (tmp_path / "step-000000008.pt").write_bytes(b"torn by a crash")
    skipped: list[tuple[Path, str]] = []
    found = load_latest(tmp_path, on_skip=lambda path, error: skipped.append((path, error)))
    assert found is not None and found[0] == 4
    assert [p.name for p, _ in skipped] == ["step-000000008.pt"]
