"""Nothing that holds the job's secret prints it: the repr and str of every object that carries it, and a
traceback formatted with its frames' locals, as error reporters and `rich`-style tracebacks capture them,
both of a function holding those objects and of a real connection that failed inside the wire code."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from slurm_elastic.agent import AgentConfig
from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.errors import AuthError
from slurm_elastic.faults import FaultPlan
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.jobsecret import Secret
from slurm_elastic.wire.channel import connect, new_secret
from slurm_elastic.worker.env import WorkerEnv, worker_env

pytestmark = pytest.mark.timeout(60)


def holders(secret: str) -> dict[str, object]:
    """Every object of the library that holds the secret, built as the library builds it."""
    return {
        "worker_env": worker_env({"SLURM_ELASTIC_COORDINATOR": "127.0.0.1:1"}, secret=secret),
        "env": WorkerEnv("127.0.0.1:1", secret, "j", "n1", 0, "n1:0:0", 0, 0, None, Path("/c"), 5, True, FaultPlan()),
        "config": AgentConfig(node="n1", nproc=1, coordinator="h:1", secret=secret, job_id="j", command=["python"]),
        "settings": CoordinatorConfig(job_id="j", secret=secret, expected_workers=2),
        "handle": JobHandle("j", "127.0.0.1:1", secret, "n1", 1, 0.0),
    }


def locals_traceback(exc: BaseException) -> str:
    return "".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())


@pytest.mark.parametrize("secret", [new_secret(), "plain-str-secret-0123456789"])
def test_no_holder_prints_the_secret(secret: str) -> None:
    for name, obj in holders(secret).items():
        assert secret not in repr(obj) and secret not in str(obj), name
    # The secret itself: hidden from repr (what tracebacks and debuggers show), its value for HMACs and JSON.
    assert repr(Secret(secret)) == "'<secret>'" and Secret(secret) == secret and str(Secret(secret)) == secret


def test_a_traceback_with_locals_of_code_holding_them_shows_no_secret() -> None:
    secret = new_secret()

    def train(env: WorkerEnv, config: AgentConfig, settings: CoordinatorConfig, handle: JobHandle) -> None:
        key = env.secret  # a local of its own, as library code has them  # noqa: F841
        raise RuntimeError("the training step failed")

    made = holders(secret)
    with pytest.raises(RuntimeError) as info:
        train(made["env"], made["config"], made["settings"], made["handle"])  # type: ignore[arg-type]
    text = locals_traceback(info.value)
    assert "env = WorkerEnv(" in text and "handle = JobHandle(" in text  # the locals are there
    assert secret not in text


def test_a_failed_connection_traceback_with_locals_shows_no_secret() -> None:
    """A worker whose connection to the coordinator fails (here: the coordinator refuses its proof) raises
    from inside the wire code, whose frames hold the secret as an argument."""
    theirs, mine = new_secret(), new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id="j", secret=theirs, expected_workers=1)).start()
    try:
        with pytest.raises(AuthError) as info:
            connect(thread.address, secret=mine, job_id="j", role="worker")
    finally:
        thread.stop()
    text = locals_traceback(info.value)
    assert mine not in text and theirs not in text
    assert "secret = '<secret>'" in text  # the frame's argument is there, hidden
