"""Disaster-recovery checkpoints: for planned stop/resume and the loss of every replica, never for
ordinary failures (those heal from peers).

The caller's thread copies the state (cheap); a background thread writes it, so training goes on while
the file is written. A file is written in the format of `ckptformat` (a JSON header, then the tensors' raw
bytes: no pickle), 0600, through a fresh temporary name and a rename (`ckptfiles`); the directories this
code creates are 0700. A file is read only after every field of its header is checked; a disaster-recovery
file that is a symbolic link is not read.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoints import ckptformat
from slurm_elastic.worker.checkpoints.ckptfiles import CheckpointError, make_dirs, open_file, write_file
from slurm_elastic.worker.checkpoints.state import Snapshot, StateError
from slurm_elastic.worker.replicated.replica import Replica

log = get_logger("slurm_elastic.worker")

Report = Callable[[str, dict[str, Any]], None]
_NAME = re.compile(r"^step-(\d{9})\.pt$")
FORMAT = ckptformat.FORMAT


def _path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory) if (m := _NAME.match(name))]
    return sorted(found)


def _read(path: Path, *, follow: bool) -> tuple[int, Snapshot]:
    try:
        fh = open_file(path, follow=follow)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    with fh:
        return ckptformat.read(fh, os.fstat(fh.fileno()).st_size, path)


def read_checkpoint(path: Path) -> tuple[int, Snapshot]:
    """One checkpoint file (a disaster-recovery one, or one written by `job.save(path)`): the path the user
    named is followed if it is a link."""
    return _read(path, follow=True)


def read_model_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The model's state dict in a checkpoint (`job.save(path)` or a disaster-recovery one), to evaluate or
    export the model without building a job: `model.load_state_dict(read_model_state(path))`."""
    from slurm_elastic.worker.checkpoints.state import decode

    _, snap = read_checkpoint(Path(path))
    try:
        state: dict[str, torch.Tensor] = decode(snap)["model"]
    except (StateError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} holds no model state: {str(exc)[:300]}") from None
    return state


def _write(path: Path, step: int, snap: Snapshot) -> None:
    def body(fh: BinaryIO) -> None:
        ckptformat.write(fh, step, snap.meta, snap.tensors)

    make_dirs(path.parent)
    write_file(path, body)


def write_checkpoint(path: Path, step: int, snap: Snapshot) -> None:
    """Write `snap` to `path` atomically (a fresh temporary name, fsync, rename), mode 0600; tensors are copied
    to the CPU."""
    _write(path, step, Snapshot(snap.meta, [t.detach().to("cpu", copy=True) for t in snap.tensors]))


def load_latest(directory: Path, on_skip: Callable[[Path, str], None] | None = None) -> tuple[int, Snapshot] | None:
    """The newest readable checkpoint; each unreadable newer one is passed to `on_skip(path, error)`."""
    for _, path in reversed(list_checkpoints(directory)):
        try:
            return _read(path, follow=False)
        except Exception as exc:
            # A torn, corrupt or planted file (e.g. the node died mid-write) must not block recovery: try older ones.
            if on_skip is not None:
                on_skip(path, str(exc)[:500])
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

    def take_error(self) -> BaseException | None:
        """The error of the last write, if it failed (once: it is cleared)."""
        error, self.last_error = self.last_error, None
        return error

    def _write(self, step: int, snap: Snapshot) -> None:
        try:
            _write(_path(self.directory, step), step, snap)
            self.last_saved_step = step
            for _, old in list_checkpoints(self.directory)[: -self.keep]:
                old.unlink(missing_ok=True)
        except Exception as exc:  # reported by the caller; a failed DR checkpoint must not stop training
            self.last_error = exc


class DisasterRecovery:
    """One worker's disaster-recovery checkpoints: loaded when the job (re)starts, written by rank 0 every
    `every` steps in the background, and at once when the job is suspended or finishes."""

    def __init__(self, directory: Path, every: int, background: bool, report: Report, keep: int = 2) -> None:
        self.directory = directory
        self.every = every
        self.writer = CheckpointWriter(directory, keep=keep, background=background)
        self.report = report  # kind, fields: one event each (a failed write is never silent)

    def load_into(self, replica: Replica) -> bool:
        skipped = lambda path, error: self.report("checkpoint_skipped", {"path": str(path), "error": error})  # noqa: E731
        found = load_latest(self.directory, on_skip=skipped)
        if found is None:
            return False
        try:
            replica.restore(found[1])
        except (StateError, RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            raise CheckpointError(
                f"the checkpoint of step {found[0]} in {self.directory} does not fit this job: {str(exc)[:300]}"
            ) from None
        log.info("resumed_from_checkpoint", step=replica.step, directory=str(self.directory))
        return True

    def save_now(self, replica: Replica) -> None:
        self._check()
        self.writer.save(replica.step, replica.capture())
        self.writer.wait()
        self._check()

    def after_commit(self, replica: Replica, rank: int) -> None:
        if self.every and rank == 0 and replica.step % self.every == 0:
            self._check()  # the previous background write
            self.writer.save(replica.step, replica.capture())

    def close(self) -> None:
        self.writer.wait()
        self._check()

    def _check(self) -> None:
        error = self.writer.take_error()
        if error is not None:
            fields = {"directory": str(self.directory), "error": f"{type(error).__name__}: {error}"[:500]}
            self.report("checkpoint_failed", fields)
