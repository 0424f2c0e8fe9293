"""Reading coordinator.json as root on behalf of a job's user: only a private, regular file of that user."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path, PurePosixPath

import pytest

from slurm_elastic.hooks.handle import MAX_HANDLE_BYTES, HandleMissing, check_handle_stat, parse_handle, read_handle
from slurm_elastic.hooks.hookenv import HookInputError
from slurm_elastic.jobdir import JobHandle

SECRET = "ab" * 32
HANDLE = JobHandle("77", "10.0.0.5:4242", SECRET, "n1", 123, 1.5)
UID = os.getuid()


def write(directory: Path, handle: JobHandle = HANDLE) -> PurePosixPath:
    return PurePosixPath(handle.write(directory))


def test_reads_what_the_launcher_writes(tmp_path: Path) -> None:
    assert read_handle(write(tmp_path), UID) == HANDLE


def test_unknown_keys_from_a_newer_launcher_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path)
    data = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**data, "launch": "x"}))
    assert read_handle(path, UID) == HANDLE


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    real = write(tmp_path / "real")
    link = tmp_path / "coordinator.json"
    link.symlink_to(real)
    with pytest.raises(HookInputError, match="symbolic link"):
        read_handle(PurePosixPath(link), UID)


def test_a_fifo_does_not_hang_the_hook(tmp_path: Path) -> None:
    fifo = tmp_path / "coordinator.json"
    os.mkfifo(fifo, 0o600)
    result: list[BaseException] = []

    def attempt() -> None:
        try:
            read_handle(PurePosixPath(fifo), UID)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], HookInputError) and "not a regular file" in str(result[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    os.chown(path, 12345, -1)
    with pytest.raises(HookInputError, match="owned by uid 12345, not by the job's user"):
        read_handle(path, 0)
    assert read_handle(path, 12345) == HANDLE


def test_a_group_or_world_readable_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    os.chmod(path, 0o640)
    with pytest.raises(HookInputError, match="private to its owner"):
        read_handle(path, UID)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HandleMissing, match="the coordinator has ended"):
        read_handle(PurePosixPath(tmp_path / "coordinator.json"), UID)


def test_stat_checks() -> None:
    regular = stat.S_IFREG | 0o600
    check_handle_stat(regular, 5, 100, 5)
    with pytest.raises(HookInputError, match="regular"):
        check_handle_stat(stat.S_IFDIR | 0o700, 5, 100, 5)
    with pytest.raises(HookInputError, match="at most"):
        check_handle_stat(regular, 5, MAX_HANDLE_BYTES + 1, 5)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"job_id": "7\n8", "address": "h:1", "secret": SECRET}).encode(), "not a job id"),
        (json.dumps({"job_id": "7", "address": "h", "secret": SECRET}).encode(), "not HOST:PORT"),
        (json.dumps({"job_id": "7", "address": "h:0", "secret": SECRET}).encode(), "not HOST:PORT"),
        (json.dumps({"job_id": "7", "address": "h:70000", "secret": SECRET}).encode(), "not HOST:PORT"),
        (json.dumps({"job_id": "7", "address": "$(id):1", "secret": SECRET}).encode(), "not HOST:PORT"),
        (json.dumps({"job_id": "7", "address": "h:1", "secret": "short"}).encode(), "wrong length"),
        (json.dumps({"job_id": "7", "address": "h:1", "secret": SECRET, "pid": "1"}).encode(), "wrong type"),
    ],
)
def test_malformed_handles(data: bytes, why: str) -> None:
    with pytest.raises(HookInputError, match=why) as info:
        parse_handle(data)
    assert SECRET not in str(info.value)


def test_ipv6_address() -> None:
    raw = json.dumps({"job_id": "7", "address": "[::1]:5000", "secret": SECRET}).encode()
    assert parse_handle(raw).address == "[::1]:5000"
