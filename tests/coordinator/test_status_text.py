"""A worker's last words reach the operator's terminal inert: a real coordinator on 127.0.0.1 hears of a
worker that exited with terminal escapes and forged lines in its stderr (and in its id), and
`slurm-elastic status`, run as the operator runs it, prints them as escapes. The coordinator is stopped
and the command ends within the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.jobdir import JobHandle, job_dir
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(120)
JOB = "status-text"
STDERR = "Traceback ...\nValueError: bad\n2026-01-01 [info] job_finished step=100\x1b[2J\x1b]0;owned\x07\u009b1m\r"


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[CoordinatorThread, dict[str, str]]]:
    secret = ch.new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=secret, expected_workers=1)).start()
    try:
        JobHandle(JOB, thread.address, secret, "localhost", os.getpid(), time.time()).write(job_dir(JOB, tmp_path))
        yield thread, {**os.environ, "SLURM_ELASTIC_HOME": str(tmp_path)}
    finally:
        thread.stop()


def report_hostile_exit(thread: CoordinatorThread) -> None:
    agent = ch.connect(thread.address, secret=thread.coordinator.config.secret, job_id=JOB, role="agent", timeout=5)
    try:
        agent.send(msg.RegisterNode(node="n1", host="h", nproc=1, pid=1))
        assert isinstance(agent.recv(timeout=10), msg.Ack)
        agent.send(msg.WorkerExited(worker_id="n1:0:0\x1b[8m", returncode=1, will_restart=False, stderr_tail=STDERR))
        deadline = time.monotonic() + 10
        while thread.view().phase != "failed":  # the command never joined: the job fails, quoting its stderr
            assert time.monotonic() < deadline, thread.view()
            time.sleep(0.02)
    finally:
        agent.close()


def status(env: dict[str, str], *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "slurm_elastic", "status", "--job", JOB, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_workers_stderr_reaches_status_as_escapes(job: tuple[CoordinatorThread, dict[str, str]]) -> None:
    thread, env = job
    report_hostile_exit(thread)
    text = status(env)
    assert "worker_exited" in text and "job_failed" in text
    assert [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0] == []
    assert not any(line.startswith("2026-01-01") for line in text.splitlines())
    assert "worker=n1:0:0\\x1b[8m" in text  # shown, for the operator to see what the worker sent
    raw = json.loads(status(env, "--json"))
    exited = [e for e in raw["events"] if e["event"] == "worker_exited"]
    assert exited[0]["stderr_tail"] == STDERR[-500:] and exited[0]["worker"] == "n1:0:0\x1b[8m"  # JSON: as it was
