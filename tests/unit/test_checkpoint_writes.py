"""Writing checkpoints into a directory others may write to: a link planted at a predictable name or in place of
a step's directory is never written through, and what this code creates is private (directories 0700, files
0600) whatever the umask, while a directory the user gave us keeps its mode."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from slurm_elastic.worker.checkpoints.checkpoint import (
    CheckpointError,
    CheckpointWriter,
    read_checkpoint,
    write_checkpoint,
)
from slurm_elastic.worker.replicated.replica import Replica
from slurm_elastic.worker.sharded.checkpoint import complete_checkpoints, save_shard

pytestmark = pytest.mark.timeout(60)
PRECIOUS = b"the user's own file\n"
SMALL = {"progress": {"step": 4, "cursor": 0}, "keys": {"w": []}, "groups": [{"lr": 0.1}], "state": {"w": {}}}
NOBODY = 65534


def replica() -> Replica:
    model = torch.nn.Linear(4, 3)
    return Replica(model, torch.optim.SGD(model.parameters(), lr=0.1), None)


def shard(directory: Path, step: int = 4) -> Path:
    return save_shard(directory, step, 0, 1, {"w/param": torch.ones(3, 4)}, {**SMALL, "progress": {"step": step}})


def modes(root: Path) -> dict[str, int]:
    """The permission bits of everything below `root` (links not followed), by path relative to it."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim" / "bashrc"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    return path


@pytest.mark.parametrize("writer", ["job.save", "disaster recovery"])
def test_a_link_planted_at_the_old_predictable_temporary_name_is_never_written_through(
    tmp_path: Path, victim: Path, writer: str
) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    if writer == "job.save":
        final = directory / "snap.pt"
        planted = directory / f".snap.pt.tmp{os.getpid()}"  # the name used before
        planted.symlink_to(victim)
        write_checkpoint(final, 3, replica().capture())
    else:
        final = directory / "step-000000003.pt"
        planted = directory / f"step-000000003.tmp{os.getpid()}"
        planted.symlink_to(victim)
        w = CheckpointWriter(directory, background=False)
        w.save(3, replica().capture())
        assert w.take_error() is None
    assert victim.read_bytes() == PRECIOUS, "the planted link was written through"
    assert stat.S_ISREG(final.lstat().st_mode) and read_checkpoint(final)[0] == 3


def test_a_link_planted_for_a_step_directory_is_never_written_through(tmp_path: Path, victim: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "step-000000004").symlink_to(victim.parent)
    with pytest.raises(CheckpointError, match="step-000000004: it is a symbolic link"):
        shard(directory)
    assert sorted(os.listdir(victim.parent)) == ["bashrc"], "nothing was written into the link's target"


def test_a_link_planted_for_a_rank_directory_is_replaced_not_followed(tmp_path: Path, victim: Path) -> None:
    directory = tmp_path / "ckpt"
    (directory / "step-000000004").mkdir(parents=True)
    (directory / "step-000000004" / "rank-00000").symlink_to(victim.parent)
    where = shard(directory)
    assert sorted(os.listdir(victim.parent)) == ["bashrc"] and victim.read_bytes() == PRECIOUS
    assert stat.S_ISDIR(where.lstat().st_mode) and complete_checkpoints(directory) == [(4, 1)]


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a directory of another user: needs root")
def test_a_step_directory_of_another_user_is_not_written_into(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    (directory / "step-000000004").mkdir(parents=True)
    os.chown(directory / "step-000000004", NOBODY, NOBODY)
    (directory / "step-000000004").chmod(0o777)
    with pytest.raises(CheckpointError, match=f"owned by uid {NOBODY}"):
        shard(directory)
    assert os.listdir(directory / "step-000000004") == []


@pytest.fixture(params=[0o022, 0o000, 0o277])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_what_is_written_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    write_checkpoint(tmp_path / "saved" / "sub" / "snap.pt", 1, replica().capture())
    CheckpointWriter(tmp_path / "dr", background=False).save(2, replica().capture())
    shard(tmp_path / "sharded")
    found = modes(tmp_path)
    dirs = {p for p in found if (tmp_path / p).is_dir()}
    assert dirs == {
        "saved", "saved/sub", "dr", "sharded", "sharded/step-000000004", "sharded/step-000000004/rank-00000",
    }  # fmt: skip
    assert {p: m for p, m in found.items() if p in dirs} == dict.fromkeys(dirs, 0o700)
    files = {p: m for p, m in found.items() if p not in dirs}
    names = {"snap.pt", "step-000000002.pt", "__0_0.distcp", ".metadata", "small.json", "done.json"}
    assert {Path(p).name for p in files} == names
    assert set(files.values()) == {0o600}, files


def test_a_directory_the_user_gave_keeps_its_mode(tmp_path: Path) -> None:
    for name in ("dr", "sharded"):
        (tmp_path / name).mkdir(mode=0o755)
        (tmp_path / name).chmod(0o755)
    CheckpointWriter(tmp_path / "dr", background=False).save(2, replica().capture())
    shard(tmp_path / "sharded")
    assert stat.S_IMODE((tmp_path / "dr").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "sharded").stat().st_mode) == 0o755


def test_dcp_writes_into_a_fresh_directory_only_this_process_can_write_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, int]] = []
    save = dcp.save

    def spy(state: Any, *, storage_writer: Any, **kwargs: Any) -> Any:
        st = os.lstat(storage_writer.path)
        seen.append((Path(storage_writer.path).name, stat.S_IMODE(st.st_mode), len(os.listdir(storage_writer.path))))
        return save(state, storage_writer=storage_writer, **kwargs)

    monkeypatch.setattr(dcp, "save", spy)
    old = os.umask(0o022)
    try:
        shard(tmp_path / "ckpt")
    finally:
        os.umask(old)
    ((name, mode, entries),) = seen
    assert name.startswith(".rank-00000.") and name.endswith(".tmp"), name
    assert (mode, entries) == (0o700, 0)
    assert sorted(os.listdir(tmp_path / "ckpt" / "step-000000004")) == ["rank-00000"], "no temporary left"
