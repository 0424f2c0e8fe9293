"""Disaster-recovery checkpoints: for planned stop/resume and the loss of every replica, never for
ordinary failures (those heal from peers).

The caller's thread copies the state (cheap); a background thread writes it, so training goes on while
the file is written. Files are written under a temporary name and renamed, and loaded with
`torch.load(weights_only=True)`, which restores tensors and plain values but never arbitrary objects.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import structlog
import torch

from slurm_elastic.errors import ElasticError
from slurm_elastic.worker.replica import Replica
from slurm_elastic.worker.state import Snapshot

log = structlog.get_logger("slurm_elastic.worker")

_NAME = re.compile(r"^step-(\d{9})\.pt$")
FORMAT = 1


class CheckpointError(ElasticError):
    """A checkpoint could not be written or read."""


def _path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _NAME.match(name))]
    return sorted(found)


def load_latest(directory: Path) -> tuple[int, Snapshot] | None:
    for step, path in reversed(list_checkpoints(directory)):
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            if data.get("format") != FORMAT:
                raise CheckpointError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
            return step, Snapshot(json.loads(data["meta"]), list(data["tensors"]))
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            # A torn or corrupt file (e.g. the node died mid-write) must not block recovery: try older ones.
            print(f"slurm-elastic: skipping unreadable checkpoint {path}: {exc}", flush=True)
    return None


class CheckpointWriter:
    def __init__(self, directory: Path, *, keep: int = 2, background: bool = True) -> None:
        self.directory = directory
        self.keep = keep
        self.background = background
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None
        self.last_saved_step = -1

    def save(self, step: int, snap: Snapshot) -> None:
        self.wait()
        copied = Snapshot(snap.meta, [t.detach().to("cpu", copy=True) for t in snap.tensors])
        if self.background:
            self._thread = threading.Thread(target=self._write, args=(step, copied), name="se-ckpt", daemon=True)
            self._thread.start()
        else:
            self._write(step, copied)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, step: int, snap: Snapshot) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            final = _path(self.directory, step)
            tmp = final.with_suffix(f".tmp{os.getpid()}")
            payload = {"format": FORMAT, "step": step, "meta": json.dumps(snap.meta), "tensors": snap.tensors}
            with open(tmp, "wb") as fh:
                torch.save(payload, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            self.last_saved_step = step
            for _, old in list_checkpoints(self.directory)[: -self.keep]:
                old.unlink(missing_ok=True)
        except Exception as exc:  # reported by the caller; a failed DR checkpoint must not stop training
            self.last_error = exc


class DisasterRecovery:
    """One worker's disaster-recovery checkpoints: loaded when the job (re)starts, written by rank 0 every
    `every` steps in the background, and at once when the job is suspended or finishes."""

    def __init__(self, directory: Path, every: int, background: bool) -> None:
        self.directory = directory
        self.every = every
        self.writer = CheckpointWriter(directory, background=background)

    def load_into(self, replica: Replica) -> bool:
        found = load_latest(self.directory)
        if found is None:
            return False
        replica.restore(found[1])
        log.info("resumed_from_checkpoint", step=replica.step, directory=str(self.directory))
        return True

    def save_now(self, replica: Replica) -> None:
        self.writer.save(replica.step, replica.capture())
        self.writer.wait()

    def after_commit(self, replica: Replica, rank: int) -> None:
        if self.every and rank == 0 and replica.step % self.every == 0:
            self.writer.save(replica.step, replica.capture())

    def close(self) -> None:
        self.writer.wait()
