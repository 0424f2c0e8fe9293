"""The token file is copied once per node into shared memory; later workers map the copy, not storage."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from slurm_elastic.data import TokenDataset
from slurm_elastic.data._format import TOKENS_FILE
from slurm_elastic.nodecache import job_cache_dir, node_local, remove_job_cache


@pytest.fixture
def in_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "shm"
    monkeypatch.setenv("SLURM_ELASTIC_CACHE_DIR", str(cache))
    monkeypatch.setenv("SLURM_ELASTIC_JOB_ID", "local-1")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return cache / "local-1"


def test_a_worker_that_comes_later_maps_the_copy_and_never_reads_storage(dataset_dir: Path, in_job: Path) -> None:
    first = TokenDataset(dataset_dir, seq_len=8)
    expected = [first[i][0].tolist() for i in range(len(first))]
    copies = [p for p in in_job.iterdir() if p.name.endswith(TOKENS_FILE)]
    assert len(copies) == 1 and str(first.tokens.filename) == str(copies[0])
    # Storage now holds other bytes under the same name, size and time: a joiner reading it would see them.
    source = dataset_dir / TOKENS_FILE
    st = source.stat()
    source.write_bytes(b"\0" * st.st_size)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    joiner = TokenDataset(dataset_dir, seq_len=8)
    assert [joiner[i][0].tolist() for i in range(len(joiner))] == expected


def test_workers_starting_together_make_one_copy(dataset_dir: Path, in_job: Path) -> None:
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(node_local(dataset_dir / TOKENS_FILE))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and paths[0].parent == in_job
    assert [p.name for p in in_job.iterdir() if not p.name.startswith(".")] == [paths[0].name]


def test_outside_a_job_the_original_file_is_used(dataset_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_ELASTIC_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert node_local(dataset_dir / TOKENS_FILE) == dataset_dir / TOKENS_FILE
    assert job_cache_dir({"SLURM_JOB_ID": "../etc"}) is None, "a job id is never a path"


def test_a_directory_planted_by_someone_else_is_not_used(dataset_dir: Path, in_job: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    in_job.parent.mkdir(parents=True)
    in_job.symlink_to(elsewhere)
    assert node_local(dataset_dir / TOKENS_FILE) == dataset_dir / TOKENS_FILE
    assert list(elsewhere.iterdir()) == []
    remove_job_cache()
    assert elsewhere.is_dir(), "cleanup never follows a symlink"


def test_the_job_cache_is_removed_when_the_job_leaves(dataset_dir: Path, in_job: Path) -> None:
    node_local(dataset_dir / TOKENS_FILE)
    assert in_job.is_dir()
    remove_job_cache()
    assert not in_job.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user: needs root")
def test_a_copy_planted_under_the_jobs_name_is_never_mapped(dataset_dir: Path, in_job: Path) -> None:
    """Job ids and the copy's name are predictable: another user (nobody) prepares the job's directory
    and a poisoned copy before the job starts. The worker reads the original instead."""
    from slurm_elastic.nodecache import _key

    source = dataset_dir / TOKENS_FILE
    in_job.mkdir(parents=True)
    in_job.parent.chmod(0o1777)
    poisoned = in_job / _key(source)
    poisoned.write_bytes(b"\1" * source.stat().st_size)
    for path in (in_job, poisoned):
        os.chown(path, 65534, 65534)
    in_job.chmod(0o777)
    assert node_local(source) == source
    assert poisoned.read_bytes() == b"\1" * source.stat().st_size  # left alone


@pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user: needs root")
def test_a_cache_directory_others_may_rewrite_is_not_used(dataset_dir: Path, in_job: Path) -> None:
    in_job.parent.mkdir(parents=True)
    os.chown(in_job.parent, 65534, 65534)
    assert node_local(dataset_dir / TOKENS_FILE) == dataset_dir / TOKENS_FILE
    os.chown(in_job.parent, 0, 0)
    in_job.parent.chmod(0o777)  # anyone may rename our directory away: not sticky
    assert node_local(dataset_dir / TOKENS_FILE) == dataset_dir / TOKENS_FILE
    in_job.parent.chmod(0o1777)
    assert node_local(dataset_dir / TOKENS_FILE).parent == in_job
