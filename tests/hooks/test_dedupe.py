"""The health check tells each job once per node state, retries a silent coordinator a few times, and
forgets when the node is back in service."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from slurm_elastic.hooks.dedupe import MAX_ATTEMPTS, Claim, Record, RunState, StateFile, after_notify, mode_for, plan


def test_a_drain_is_told_once() -> None:
    first = plan("DRAIN", ["12", "7"], {})
    assert first.to_notify == (("7", "boundary"), ("12", "boundary"))
    records = after_notify(after_notify(first.records, "7", "DRAIN", True), "12", "DRAIN", True)
    assert plan("DRAIN", ["12", "7"], records).to_notify == ()


def test_fail_after_drain_is_news() -> None:
    records = after_notify(plan("DRAIN", ["7"], {}).records, "7", "DRAIN", True)
    again = plan("FAIL", ["7"], records)
    assert again.to_notify == (("7", "now"),)
    assert set(again.records) == {"7:FAIL"}  # the DRAIN record is dropped


def test_an_unanswered_job_is_retried_then_left_alone() -> None:
    records: dict[str, Record] = {}
    told = 0
    for _ in range(MAX_ATTEMPTS + 3):
        step = plan("FAIL", ["7"], records)
        records = step.records
        for job, _mode in step.to_notify:
            told += 1
            records = after_notify(records, job, "FAIL", False)
    assert told == MAX_ATTEMPTS


def test_back_in_service_forgets_everything() -> None:
    records = after_notify(plan("DRAIN", ["7"], {}).records, "7", "DRAIN", True)
    assert plan(None, ["7"], records).records == {}
    assert plan("DRAIN", ["7"], plan(None, ["7"], records).records).to_notify == (("7", "boundary"),)


def test_jobs_that_left_the_node_are_forgotten() -> None:
    records = after_notify(plan("DRAIN", ["7"], {}).records, "7", "DRAIN", True)
    assert plan("DRAIN", ["8"], records).records == {"8:DRAIN": Record()}


def test_modes() -> None:
    assert mode_for("FAIL") == "now" and mode_for("DRAIN") == "boundary"


def test_state_file_round_trip(tmp_path: Path) -> None:
    files = StateFile(tmp_path / "state", "n3")
    assert files.load() == RunState()
    state = RunState({"7:DRAIN": Record(1, True)}, 123.5)
    with files.locked() as got:
        assert got.held
        files.save(state)
    assert files.load() == state
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert files.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "state").iterdir() if p.name.endswith(".tmp")] == []


def test_a_damaged_state_file_is_an_empty_state(tmp_path: Path) -> None:
    files = StateFile(tmp_path, "n3")
    for text in ("{", "[]", '{"records": {"7:DRAIN": {"attempts": "x"}}}', '{"records": 5}'):
        files.path.write_text(text)
        assert files.load() == RunState()


def test_a_second_run_sees_the_lock_held_and_until_when(tmp_path: Path) -> None:
    files = StateFile(tmp_path, "n3")
    with files.locked(until=1000.5) as first:
        assert first.held
        # flock locks belong to open file descriptions: a second open in this process conflicts, as a
        # second health check process would.
        with StateFile(tmp_path, "n3").locked(until=2000.0) as second:
            assert second == Claim(False, 1000.5)
            assert not second.overran(now=1001.0, grace_s=1.0)
            assert second.overran(now=1001.6, grace_s=1.0)
    with files.locked(until=3000.0) as again:
        assert again == Claim(True, 3000.0) and not again.overran(now=9999.0, grace_s=1.0)
    files.lock_path.write_text("garbage")  # a holder that wrote no time counts as overrun
    fd = os.open(files.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with StateFile(tmp_path, "n3").locked() as other:
            assert other == Claim(False, 0.0) and other.overran(now=5.0, grace_s=1.0)
    finally:
        os.close(fd)


def test_a_symlinked_state_file_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    files = StateFile(tmp_path, "n3")
    os.symlink(victim, files.path)
    assert files.load() == RunState()
