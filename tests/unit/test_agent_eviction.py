"""A worker the coordinator had killed (a hang eviction) says nothing about the coordinator, whatever it exits
with: its node's agent must not end as failed. Seen in CI as a 1-in-many flake of the float32 hang test, when
the agent continued the stopped worker before killing it and the worker, finding its connection closed by the
eviction, exited first with "coordinator lost"."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from slurm_elastic.agent import EXIT_FAILED, Agent, AgentConfig
from slurm_elastic.decide.worker import EXIT_COORDINATOR_LOST

pytestmark = pytest.mark.timeout(60)


def _agent() -> Agent:
    config = AgentConfig(node="n1", nproc=1, coordinator="127.0.0.1:1", secret="s" * 32, job_id="j", command=["x"])
    return Agent(config)


def _stopped_process() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.send_signal(signal.SIGSTOP)
    return proc


def test_a_hung_worker_is_killed_without_being_continued_first() -> None:
    agent, proc = _agent(), _stopped_process()
    slot = agent.slots[0]
    slot.proc = proc
    try:
        with agent._lock:
            agent._kill(agent.worker_id(slot), "no heartbeat for 3.1 s")
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    assert slot.evicted and not slot.expected_exit  # a crash for the restart budget, not a restart on request


def test_an_evicted_worker_exiting_with_coordinator_lost_leaves_the_agent_successful() -> None:
    agent, proc = _agent(), _stopped_process()
    slot = agent.slots[0]
    slot.proc = proc
    with agent._lock:
        agent._kill(agent.worker_id(slot), "hung")
        proc.wait(timeout=10)
        agent._ended(slot, EXIT_COORDINATOR_LOST, "")  # as if it had got out first
    assert agent._exit_code() == 0


def test_a_worker_that_lost_the_coordinator_by_itself_fails_the_agent() -> None:
    agent = _agent()
    slot = agent.slots[0]
    with agent._lock:
        agent._ended(slot, EXIT_COORDINATOR_LOST, "")
    assert agent._exit_code() == EXIT_FAILED
