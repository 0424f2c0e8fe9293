"""Disaster-recovery checkpoints of a sharded (FSDP2) job: written sharded with torch.distributed.checkpoint,
read back at any world size.

Every rank of the first replica group (with HSDP; else every rank) writes its own shard of the parameters and
optimizer moments as a DCP checkpoint of its own (`step-NNNNNNNNN/rank-RRRRR/`, no collective: it can run on a
background thread while training goes on), with `small.json` (the replicated state) and `done.json`, into a
fresh private directory that is then renamed into place. A step's checkpoint is complete when every rank of
its world wrote `done.json`. To read it, the ranks' DCP metadata are merged into one (each chunk records its
global offsets), and DCP reads, for every rank of the new world, the rows of its new shard from whichever
files hold them.

The checkpoint directory may be one others can write to (a team's, a copy): DCP's metadata (pickles) are read
by `dcpmeta`'s unpickler and checked; `done.json` and `small.json` are checked before use; no link below the
directory is followed; DCP is never asked to unpickle bytes. Directories are made 0700, files 0600.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import stat
import threading
import warnings
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoints.ckptfiles import (
    CheckpointError,
    fresh_dir,
    make_dirs,
    open_beneath,
    own_dir,
    read_beneath,
    write_file,
)
from slurm_elastic.worker.checkpoints.ckptformat import torch_load_is_safe
from slurm_elastic.worker.sharded import dcpmeta
from slurm_elastic.worker.sharded.holder import ShardedReplica

log = get_logger("slurm_elastic.worker")
Report = Callable[[str, dict[str, Any]], None]
OnSkip = Callable[[Path, str], None]
_STEP = re.compile(r"^step-(\d{9})$")
_RANK = re.compile(r"^rank-\d{5}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_WORLD = 1 << 16
MAX_DONE_BYTES = 4096
MAX_SMALL_BYTES = 64 * 1024 * 1024
MAX_STATE_KEYS = 16


def _rank_dir(rank: int) -> str:
    return f"rank-{rank:05d}"


def _step_name(step: int) -> str:
    return f"step-{step:09d}"


def _step_dir(directory: Path, step: int) -> Path:
    return directory / _step_name(step)


def _json(directory: Path, parts: list[str], limit: int) -> Any:
    try:
        return json.loads(read_beneath(directory, parts, limit))
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{directory.joinpath(*parts)} is not valid JSON: {str(exc)[:200]}") from None


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_done(done: Any, step: int) -> int:
    """The world a rank's `done.json` states, checked: an object of a small positive `world` and this `step`."""
    if not isinstance(done, dict) or not _int(done.get("world"), 1, MAX_WORLD) or done.get("step") != step:
        raise ValueError(f'it is {str(done)[:120]}; expected {{"world": 1..{MAX_WORLD}, "step": {step}}}')
    return int(done["world"])


def _done(directory: Path, name: str, rank: int, step: int) -> int | None:
    try:
        return check_done(_json(directory, [name, _rank_dir(rank), "done.json"], MAX_DONE_BYTES), step)
    except FileNotFoundError:
        return None


def _world(directory: Path, name: str, step: int) -> int | None:
    """The world of the complete checkpoint in `directory/name`; None while ranks are missing (being written,
    or torn); CheckpointError or ValueError when something there is refused. Reads at most one `done.json` per
    rank directory present, whatever world a file claims."""
    if not stat.S_ISDIR(os.lstat(directory / name).st_mode):
        raise CheckpointError(f"{directory / name} is a symbolic link or not a directory")
    ranks = {n for n in os.listdir(directory / name) if _RANK.match(n)}
    world = _done(directory, name, 0, step) if _rank_dir(0) in ranks else None
    if world is None or world > len(ranks):
        return None  # the other ranks have not written yet
    for rank in range(1, world):
        if _rank_dir(rank) not in ranks or _done(directory, name, rank, step) != world:
            return None  # not written yet, or an older write of the same step by another world
    return world


def complete_checkpoints(directory: Path, on_skip: OnSkip | None = None) -> list[tuple[int, int]]:
    """(step, world) of every complete checkpoint, oldest first. A step whose files are refused is left out
    and passed to `on_skip(path, why)` (else logged)."""
    if not directory.is_dir():
        return []
    found = []
    for name in os.listdir(directory):
        if not (m := _STEP.match(name)):
            continue
        try:
            world = _world(directory, name, int(m.group(1)))
        except (CheckpointError, ValueError) as exc:
            why = str(exc)[:500]
            if on_skip is not None:
                on_skip(directory / name, why)
            else:
                log.warning("checkpoint_skipped", path=str(directory / name), error=why)
            continue
        except OSError:  # removed meanwhile (prune)
            continue
        if world is not None:
            found.append((int(m.group(1)), world))
    return sorted(found)


def check_small(small: Any, step: int) -> dict[str, Any]:
    """`small.json`, checked for what is used before the state is restored: the progress of this step, the
    sharded optimizer state's names (a few identifiers per parameter), the parameter groups (without params)."""
    if not isinstance(small, dict):
        raise ValueError(f"it holds a {type(small).__name__}, expected an object")
    progress, keys, groups = small.get("progress"), small.get("keys"), small.get("groups")
    if not isinstance(progress, dict) or progress.get("step") != step or not _int(progress.get("cursor"), 0, 2**62):
        raise ValueError(f"its progress is {str(progress)[:120]}; expected step {step} and a cursor")
    if not isinstance(keys, dict) or not all(
        isinstance(fqn, str)
        and isinstance(names, list)
        and len(names) <= MAX_STATE_KEYS
        and len(set(names)) == len(names)
        and all(isinstance(k, str) and _KEY.match(k) for k in names)
        for fqn, names in keys.items()
    ):
        raise ValueError(f"its keys are {str(keys)[:120]}; expected at most {MAX_STATE_KEYS} names per parameter")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "params" not in g for g in groups):
        raise ValueError("its groups are not a list of optimizer settings")
    if not isinstance(small.get("state"), dict):
        raise ValueError("its state is not an object")
    return small


def read_small(directory: Path, step: int) -> dict[str, Any]:
    """The replicated state of the checkpoint of `step`, as rank 0 wrote it, checked."""
    parts = [_step_name(step), _rank_dir(0), "small.json"]
    try:
        return check_small(_json(directory, parts, MAX_SMALL_BYTES), step)
    except ValueError as exc:
        raise CheckpointError(f"{directory.joinpath(*parts)}: {exc}") from None


def read_metadata(directory: Path, step: int, rank: int) -> Metadata:
    """One rank's DCP metadata, unpickled by `dcpmeta` and checked."""
    parts = [_step_name(step), _rank_dir(rank), ".metadata"]
    data = read_beneath(directory, parts, dcpmeta.MAX_METADATA_BYTES)
    try:
        return dcpmeta.check(dcpmeta.loads(data))
    except Exception as exc:  # a refused name, a malformed pickle: anything
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        raise CheckpointError(f"refusing {directory.joinpath(*parts)}: {why}") from None


class _Beneath(FileSystem):
    """DCP's file access for reading, each name below `root` opened without following a link."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if mode != "rb":
            raise CheckpointError(f"a checkpoint being read is never written ({path}, {mode})")
        with open_beneath(self.root, Path(path).relative_to(self.root).parts) as fh:
            yield fh


class _TensorsOnly(DefaultLoadPlanner):
    def load_bytes(self, read_item: Any, value: Any) -> None:
        raise CheckpointError(f"refusing bytes for {read_item.dest_index.fqn}: checkpoints of ours hold tensors only")


def _merge(directory: Path, step: int, world: int) -> Metadata:
    """Every rank's DCP metadata of one checkpoint, as if it were one DCP checkpoint's."""
    merged: Metadata | None = None
    for rank in range(world):
        part = read_metadata(directory, step, rank)
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
                assert isinstance(target, TensorStorageMetadata)  # dcpmeta.check: tensors only
                target.chunks.extend(meta.chunks)
        merged.storage_data.update(storage)
    if merged is None:
        raise CheckpointError(f"{_step_dir(directory, step)}: a checkpoint of {world} ranks")
    return merged


class _Merged(FileSystemReader):
    """A reader over every rank's part of one checkpoint. The metadata are read and checked when it is made
    (DCP would log an error of `read_metadata` and go on without it); files are opened by `_Beneath`."""

    def __init__(self, directory: Path, step: int, world: int) -> None:
        super().__init__(_step_dir(directory, step))
        self.fs = _Beneath(directory)
        self.merged = _merge(directory, step, world)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.merged


def _first_cause(exc: CheckpointException) -> BaseException:
    for failure in exc.failures.values():
        return failure[0] if isinstance(failure, tuple) else failure
    return exc


def load_state(directory: Path, step: int, world: int, state: dict[str, Any]) -> None:
    """Fill the tensors of `state` from the checkpoint of `step` written by `world` ranks (DCP reads each
    tensor with torch.load(weights_only=True), safe only from torch 2.6 on)."""
    if not torch_load_is_safe(str(torch.__version__)):
        raise CheckpointError(
            f"reading sharded checkpoints needs torch >= 2.6 (torch {torch.__version__}'s weights_only can be "
            "bypassed, CVE-2025-32434)"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=_Merged(directory, step, world), planner=_TensorsOnly(), no_dist=True)
    except CheckpointException as exc:
        cause = _first_cause(exc)
        if isinstance(cause, CheckpointError):
            raise cause from None
        why = f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
        raise CheckpointError(f"cannot read the checkpoint {_step_dir(directory, step)}: {why}") from None


def _state_dict(replica: ShardedReplica, copy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in replica.entries():
        fp = replica.params[entry.fqn]
        rows = replica.own(entry)
        out[f"{entry.fqn}/{entry.key}"] = fp.to_sharded_dtensor(rows.clone() if copy else rows)
    return out


def _replace_dir(tmp: Path, where: Path) -> None:
    """Rename the finished directory `tmp` to `where`, removing what a torn or older write left there."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(where).st_mode):
            shutil.rmtree(where)
        else:
            where.unlink()  # a link or a file is removed, never followed
    os.rename(tmp, where)


def save_shard(directory: Path, step: int, rank: int, world: int, state: dict[str, Any], small: dict[str, Any]) -> Path:
    make_dirs(directory)
    tmp = fresh_dir(own_dir(directory, _step_name(step)), _rank_dir(rank))  # only this process writes there
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is not initialized": one rank's own part
            dcp.save(state, storage_writer=FileSystemWriter(tmp), no_dist=True)
        for entry in os.scandir(tmp):  # DCP's files, created with the umask's mode
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, 0o600)
        write_file(tmp / "small.json", lambda fh: fh.write(json.dumps(small).encode()))
        write_file(tmp / "done.json", lambda fh: fh.write(json.dumps({"world": world, "step": step}).encode()))
        where = _step_dir(directory, step) / _rank_dir(rank)
        _replace_dir(tmp, where)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return where


def load_shard(directory: Path, step: int, world: int, replica: ShardedReplica) -> dict[str, Any]:
    """Fill this rank's shard (the model must already be on the new mesh) from a checkpoint of `world` ranks;
    returns the small replicated state, checked."""
    small = read_small(directory, step)
    load_state(directory, step, world, _state_dict(replica, copy=False))
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
        skipped = lambda path, error: self.report("checkpoint_skipped", {"path": str(path), "error": error})  # noqa: E731
        return bool(complete_checkpoints(self.directory, on_skip=skipped))

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


__all__ = [
    "ShardedCheckpoints", "check_done", "check_small", "complete_checkpoints", "load_shard", "load_state",
    "read_metadata", "read_small", "save_shard", "save_snapshot",
]  # fmt: skip
