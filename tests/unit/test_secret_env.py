"""The job's secret reaches the workers and nothing else: the worker library takes it out of the environment
at import, so the user's code and the processes it starts never inherit it; the agent hands it to its
workers through their own environment only. Every process a test starts ends within it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.wire.channel import new_secret
from slurm_elastic.worker import env as worker_env_module
from slurm_elastic.worker.env import SECRET, worker_env

pytestmark = pytest.mark.timeout(120)

# What a user's training script might do: read its environment, start a shell.
USER_CODE = textwrap.dedent(
    """
    import os, subprocess, sys
    seen_at_start = os.environ.get("SLURM_ELASTIC_SECRET", "absent")
    import slurm_elastic.worker  # the library, as `from slurm_elastic import ElasticJob` imports it
    from slurm_elastic.worker.env import worker_env
    env = worker_env()
    expected = sys.argv[2] if len(sys.argv) > 2 else env.secret
    child = subprocess.run(["sh", "-c", 'echo "${SLURM_ELASTIC_SECRET:-absent}"'], capture_output=True, text=True)
    with open(sys.argv[1], "w") as fh:
        fh.write(f"{seen_at_start == env.secret == expected}\\n{os.environ.get('SLURM_ELASTIC_SECRET', 'absent')}\\n")
        fh.write(child.stdout)
    """
)


def test_reading_the_environment_takes_the_secret_out_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_env_module, "_taken", "")
    monkeypatch.setenv(SECRET, "s3cret-value-0123456789")
    monkeypatch.setenv("SLURM_ELASTIC_COORDINATOR", "127.0.0.1:1")
    env = worker_env()
    assert env.secret == "s3cret-value-0123456789" and SECRET not in os.environ
    child = subprocess.run(["sh", "-c", 'echo "${SLURM_ELASTIC_SECRET:-absent}"'], capture_output=True, text=True)
    assert child.stdout.strip() == "absent"
    assert worker_env().secret == env.secret  # a second ElasticJob in the same process still has it


def test_an_explicit_environment_is_left_alone() -> None:
    given = {SECRET: "abc", "SLURM_ELASTIC_COORDINATOR": "h:1"}
    assert worker_env(given).secret == "abc" and given[SECRET] == "abc"


def test_user_code_and_its_subprocesses_never_see_the_secret(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    env = {**os.environ, SECRET: "f" * 64, "SLURM_ELASTIC_COORDINATOR": "127.0.0.1:9"}
    subprocess.run([sys.executable, "-c", USER_CODE, str(out)], env=env, check=True, timeout=60)
    assert out.read_text().split() == ["True", "absent", "absent"]


def test_the_agent_gives_the_secret_to_its_workers_only(tmp_path: Path) -> None:
    secret = new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id="env", secret=secret, expected_workers=1)).start()
    out = tmp_path / "out.txt"
    script = tmp_path / "user.py"
    script.write_text(USER_CODE)
    try:
        argv = [sys.executable, "-m", "slurm_elastic.agent", "--coordinator", thread.address, "--job-id", "env"]
        argv += ["--node", "n1", "--max-restarts", "0", "--", sys.executable, str(script), str(out), secret]
        agent = subprocess.run(argv, env={**os.environ, SECRET: secret}, capture_output=True, text=True, timeout=90)
    finally:
        thread.stop()
    assert out.exists(), agent.stderr[-2000:]
    assert out.read_text().split() == ["True", "absent", "absent"]
