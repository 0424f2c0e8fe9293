"""The hand-over of the job's secret through an inherited pipe, as a worker sees it: the variable and the
descriptor are gone once taken, a wrapper that closed or reused the descriptor gets a one-line error naming
SLURM_ELASTIC_SECRET_FD (and a reused descriptor is neither read nor closed), and nothing else is ever read."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slurm_elastic import jobsecret
from slurm_elastic.errors import ConfigError
from slurm_elastic.jobsecret import SECRET_FD, parse_secret_fd, read_secret_fd, secret_pipe, take_from_environment
from slurm_elastic.worker.env import worker_env

pytestmark = pytest.mark.timeout(60)
SECRET = "0123456789abcdef" * 4


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobsecret, "_secret", jobsecret.Secret(""))
    monkeypatch.setattr(jobsecret, "_problem", None)
    monkeypatch.delenv(SECRET_FD, raising=False)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_taking_the_secret_empties_the_variable_and_closes_the_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    fd, value = secret_pipe(SECRET)
    monkeypatch.setenv(SECRET_FD, value)
    take_from_environment()
    assert jobsecret.handed_over() == SECRET and SECRET_FD not in os.environ and not is_open(fd)
    take_from_environment()  # a second import-time call (nothing left to take) keeps it
    assert jobsecret.handed_over() == SECRET
    env = worker_env({"SLURM_ELASTIC_COORDINATOR": "127.0.0.1:1"})
    assert env.secret == SECRET and SECRET not in repr(env)


def test_a_shell_started_after_the_take_inherits_neither_variable_nor_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fd, value = secret_pipe(SECRET)
    os.set_inheritable(fd, True)  # as the worker received it; os.system and shells would pass it on
    monkeypatch.setenv(SECRET_FD, value)
    take_from_environment()
    # os.system keeps every inheritable descriptor: the way a training script could leak one
    seen = subprocess.run(
        f"env; ls -l /proc/$$/fd; cat /proc/$$/fd/{fd} 2>&1", shell=True, close_fds=False, capture_output=True
    )
    assert SECRET.encode() not in seen.stdout and SECRET_FD.encode() not in seen.stdout


def test_a_descriptor_a_wrapper_closed_is_a_clear_error_when_the_secret_is_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fd, value = secret_pipe(SECRET)
    os.close(fd)  # `exec 5<&-` in a wrapper script, or a launcher that closes descriptors
    monkeypatch.setenv(SECRET_FD, value)
    take_from_environment()  # importing the package never fails
    assert SECRET_FD not in os.environ
    with pytest.raises(ConfigError, match=f"^{SECRET_FD}={value}: descriptor {fd} is not open: a wrapper closed it"):
        worker_env({"SLURM_ELASTIC_COORDINATOR": "127.0.0.1:1"})
    assert worker_env({}).standalone  # a standalone run needs no secret


@pytest.mark.parametrize("reuse", ["file", "other-pipe"])
def test_a_reused_descriptor_is_neither_read_nor_closed(reuse: str) -> None:
    fd, value = secret_pipe(SECRET)
    writer = None
    if reuse == "file":
        other = os.open(os.devnull, os.O_RDONLY)
    else:
        other, writer = os.pipe()
        os.write(writer, b"somebody else's data")
    os.dup2(other, fd)  # the wrapper closed the agent's pipe and opened something else under its number
    os.close(other)
    try:
        with pytest.raises(ConfigError, match=f"descriptor {fd} is not the agent's pipe any more"):
            read_secret_fd(value)
        assert is_open(fd)
        if writer is not None:
            assert os.read(fd, 100) == b"somebody else's data"
    finally:
        os.close(fd)
        if writer is not None:
            os.close(writer)


def test_a_pipe_someone_read_first_is_a_clear_error() -> None:
    fd, value = secret_pipe(SECRET)
    os.read(fd, 100)  # another process that inherited it took the secret first
    with pytest.raises(ConfigError, match="the pipe was empty"):
        read_secret_fd(value)
    assert not is_open(fd)


@pytest.mark.parametrize("raw", ["", "5", "a:b", "5:", ":5", "-1:5", "5:6:7", "5 :6", "٣:5"])
def test_a_malformed_variable_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"^invalid {SECRET_FD}: .* \\(expected DESCRIPTOR:INODE"):
        parse_secret_fd(raw)


@pytest.mark.parametrize("secret", ["", "x" * 4097])
def test_the_agent_refuses_a_secret_a_pipe_cannot_take_whole(secret: str) -> None:
    with pytest.raises(ConfigError, match="the job's secret is"):
        secret_pipe(secret)


def test_the_secret_survives_exec_through_a_shell_and_is_read_by_the_python_below() -> None:
    fd, value = secret_pipe(SECRET)
    code = "import slurm_elastic, os; from slurm_elastic.jobsecret import handed_over; print(handed_over() == SECRET)"
    try:
        out = subprocess.run(
            ["sh", "-c", 'exec "$0" -c "$1"', sys.executable, code.replace("SECRET", repr(SECRET))],
            env={**os.environ, SECRET_FD: value},
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.close(fd)
    assert out.stdout.strip() == "True", out.stderr
