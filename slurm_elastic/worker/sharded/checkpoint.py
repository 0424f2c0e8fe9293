"""Disaster-recovery checkpoints of a sharded (FSDP2) job: written sharded with torch.distributed.checkpoint,
read back at any world size.

Every rank of the first replica group (with HSDP; else every rank) writes its own shard of the parameters and
optimizer moments as a DCP checkpoint of its own (`step-NNNNNNNNN/rank-RRRRR/`, no collective: it can run on a
background thread while training goes on), then `done.json`. A step's checkpoint is complete when every rank
of its world wrote `done.json`. To read it, the ranks' DCP metadata are merged into one (each chunk records
its global offsets), and DCP reads, for every rank of the new world, the rows of its new shard from whichever
files hold them. DCP's metadata files are pickles: they are read with an unpickler that only builds DCP's own
metadata classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import os
import pickle
import re
import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.sharded.holder import ShardedReplica

log = get_logger("slurm_elastic.worker")
Report = Callable[[str, dict[str, Any]], None]
_STEP = re.compile(r"^step-(\d{9})$")
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
}


def _enum_member(cls: Any, name: str) -> Any:
    """`getattr` as a pickle may call it: only for a member of an enum of DCP's metadata. Python 3.11.2
    pickles such members by name (`getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")`), 3.11.7 by
    value."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and cls.__module__ == "torch.distributed.checkpoint.metadata"
        and name in cls.__members__
    ):
        return cls[name]
    raise pickle.UnpicklingError(f"refusing getattr({cls!r}, {name!r}) in a checkpoint's metadata")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a checkpoint's metadata")


def read_metadata(path: Path) -> Metadata:
    data = (path / ".metadata").read_bytes()
    found = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(found, Metadata):
        raise pickle.UnpicklingError(f"{path}/.metadata holds a {type(found).__name__}, not DCP metadata")
    return found


class _Merged(FileSystemReader):
    """A reader over every rank's part of one checkpoint, as if it were one DCP checkpoint."""

    def __init__(self, path: Path, world: int) -> None:
        super().__init__(path)
        self.world = world

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        merged: Metadata | None = None
        for rank in range(self.world):
            part = read_metadata(Path(self.path) / _rank_dir(rank))
            storage = {
                index: dataclasses.replace(info, relative_path=f"{_rank_dir(rank)}/{info.relative_path}")
                for index, info in (part.storage_data or {}).items()
            }
            if merged is None:
                merged = Metadata(dict(part.state_dict_metadata), part.planner_data, storage)
                continue
            for key, meta in part.state_dict_metadata.items():
                if key not in merged.state_dict_metadata:
                    merged.state_dict_metadata[key] = meta
                elif isinstance(meta, TensorStorageMetadata):
                    target = merged.state_dict_metadata[key]
                    assert isinstance(target, TensorStorageMetadata)
                    target.chunks.extend(meta.chunks)
            merged.storage_data.update(storage)
        assert merged is not None
        return merged


def _rank_dir(rank: int) -> str:
    return f"rank-{rank:05d}"


def _step_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}"


def complete_checkpoints(directory: Path) -> list[tuple[int, int]]:
    """(step, world) of every complete checkpoint, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for name in os.listdir(directory):
        if not (m := _STEP.match(name)):
            continue
        try:
            first = json.loads((directory / name / _rank_dir(0) / "done.json").read_text())
            world = int(first["world"])
            if all((directory / name / _rank_dir(r) / "done.json").is_file() for r in range(world)):
                found.append((int(m.group(1)), world))
        except (OSError, ValueError, KeyError):
            continue
    return sorted(found)


def _state_dict(replica: ShardedReplica, copy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in replica.entries():
        fp = replica.params[entry.fqn]
        rows = replica.own(entry)
        out[f"{entry.fqn}/{entry.key}"] = fp.to_sharded_dtensor(rows.clone() if copy else rows)
    return out


def save_shard(directory: Path, step: int, rank: int, world: int, state: dict[str, Any], small: dict[str, Any]) -> Path:
    where = _step_dir(directory, step) / _rank_dir(rank)
    if where.exists():
        shutil.rmtree(where)  # a torn write of the same step by an earlier incarnation
    where.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is not initialized": one rank's own part
        dcp.save(state, storage_writer=FileSystemWriter(where), no_dist=True)
    (where / "small.json").write_text(json.dumps(small))
    tmp = where / "done.json.tmp"
    tmp.write_text(json.dumps({"world": world, "step": step}))
    os.replace(tmp, where / "done.json")
    return where


def load_shard(directory: Path, step: int, world: int, replica: ShardedReplica) -> dict[str, Any]:
    """Fill this rank's shard (the model must already be on the new mesh) from a checkpoint of `world` ranks;
    returns the small replicated state."""
    root = _step_dir(directory, step)
    state = _state_dict(replica, copy=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=_Merged(root, world), no_dist=True)
    small: dict[str, Any] = json.loads((root / _rank_dir(0) / "small.json").read_text())
    return small


def save_snapshot(directory: Path, replica: ShardedReplica) -> None:
    """This rank's part of a snapshot of the job at its current step (`job.save` on every rank): the first
    replica group writes its shards; then only the newest complete snapshot and this one are kept."""
    if not replica.first_replica:
        return
    state, small = _state_dict(replica, copy=False), replica.small_state()
    save_shard(directory, replica.step, replica.index, replica.world, state, small)
    if replica.index == 0:
        prune(directory, replica.step, keep=1)


def prune(directory: Path, newest: int, keep: int) -> None:
    """Remove complete checkpoints older than `newest`, but never the `keep` newest complete ones (the step
    being written may not be complete yet)."""
    done = [s for s, _ in complete_checkpoints(directory)]
    for step in done[:-keep]:
        if step < newest:
            with contextlib.suppress(OSError):
                shutil.rmtree(_step_dir(directory, step))


class ShardedCheckpoints:
    """One rank's part of the job's disaster-recovery checkpoints: its shard every `every` steps (in the
    background), and at once when the job is suspended or finishes."""

    def __init__(self, directory: Path, every: int, background: bool, report: Report, keep: int = 2) -> None:
        self.directory = directory
        self.every = every
        self.background = background
        self.report = report
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def load_into(self, replica: ShardedReplica) -> bool:
        """Loading needs the first generation's mesh: `synchronize` reads the newest complete checkpoint."""
        replica.checkpoint_dir = self.directory
        return bool(complete_checkpoints(self.directory))

    def after_commit(self, replica: ShardedReplica, rank: int) -> None:
        if self.every and replica.step % self.every == 0:
            self._save(replica, background=self.background)

    def save_now(self, replica: ShardedReplica) -> None:
        self._save(replica, background=False)

    def close(self) -> None:
        self._wait()

    def _save(self, replica: ShardedReplica, *, background: bool) -> None:
        self._wait()
        if replica.fresh or not replica.first_replica:  # HSDP: the other replica groups hold the same shards
            return
        state = _state_dict(replica, copy=True)  # the training thread goes on changing the live tensors
        small = replica.small_state()
        rank, world, step = replica.index, replica.world, replica.step

        def write() -> None:
            try:
                save_shard(self.directory, step, rank, world, state, small)
                if rank == 0:
                    prune(self.directory, step, self.keep)
            except Exception as exc:  # reported on the training thread; a failed DR checkpoint must not stop training
                self._error = exc

        if background:
            self._thread = threading.Thread(target=write, name="se-ckpt-shard", daemon=True)
            self._thread.start()
        else:
            write()
            self._wait()

    def _wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            self.report(
                "checkpoint_failed",
                {"directory": str(self.directory), "error": f"{type(error).__name__}: {error}"[:500]},
            )


__all__ = ["ShardedCheckpoints", "complete_checkpoints", "load_shard", "read_metadata", "save_shard", "save_snapshot"]
