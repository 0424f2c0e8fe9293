"""PyslurmBackend against a stand-in module with pyslurm 25.11's documented names (real pyslurm needs
Slurm 25.11, which this project does not run)."""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import pytest

from slurm_elastic.slurm.cli_backend import CliBackend, CommandResult
from slurm_elastic.slurm.errors import JobNotFound, SlurmCommandError
from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend, import_pyslurm
from slurm_elastic.slurm.records import SlurmVersion


class RPCError(Exception):
    pass


class StubJob:
    calls: list[tuple[str, Any]] = []

    def __init__(self, job_id: int, **attrs: Any) -> None:
        self.id = job_id
        defaults = {
            "name": "train", "user_name": "alice", "state": "RUNNING", "partition": "train",
            "allocated_nodes": "n[1-2]", "num_nodes": 2, "batch_host": "n1", "requeue_count": 1,
            "working_directory": "/w", "comment": None, "state_reason": "None", "time_limit": 60,
        }  # fmt: skip
        self.__dict__.update({**defaults, **attrs})

    @staticmethod
    def load(job_id: int) -> StubJob:
        if job_id == 404:
            raise RPCError("Invalid job id specified")
        return StubJob(job_id)

    def cancel(self) -> None:
        StubJob.calls.append(("cancel", self.id))

    def send_signal(self, signal: Any, steps: str) -> None:
        StubJob.calls.append(("signal", (self.id, signal, steps)))

    def requeue(self) -> None:
        StubJob.calls.append(("requeue", self.id))


class StubNode:
    modified: list[tuple[str, Any, Any]] = []

    def __init__(self, name: str | None = None, state: str = "IDLE", reason: str | None = None) -> None:
        self.name, self.state, self.reason, self.partitions = name, state, reason, ["train"]

    def modify(self, changes: StubNode) -> None:
        StubNode.modified.append((self.name or "", changes.state, changes.reason))


def stub_module() -> Any:
    mod = types.SimpleNamespace(RPCError=RPCError, Job=StubJob, Node=StubNode)
    mod.Jobs = types.SimpleNamespace(load=lambda: {1: StubJob(1), 2: StubJob(2, state="PENDING", name="x")})
    mod.Nodes = types.SimpleNamespace(
        load=lambda: {"n1": StubNode("n1", "IDLE+DRAIN", "hc"), "n2": StubNode("n2", "MIXED")}
    )
    return mod


def make() -> PyslurmBackend:
    cli = CliBackend(runner=lambda argv, env, timeout: CommandResult(0, "slurm 25.11.0\n", ""))
    return PyslurmBackend(cli=cli, pyslurm=stub_module())


def test_reads() -> None:
    backend = make()
    job = backend.job("7")
    assert (job.job_id, job.nodes, job.restart_count, job.reason) == ("7", ("n1", "n2"), 1, "")
    assert [j.job_id for j in backend.jobs(states=["PENDING"])] == ["2"]
    nodes = backend.nodes()
    assert nodes[0].drained and nodes[0].reason == "hc" and nodes[1].state == "MIXED"
    assert [n.name for n in backend.nodes("n2")] == ["n2"]
    assert backend.version() == SlurmVersion(25, 11, 0)
    assert backend.hostnames("n[1-2]") == ["n1", "n2"]


def test_errors() -> None:
    with pytest.raises(JobNotFound):
        make().job("404")
    mod = stub_module()
    mod.Nodes = types.SimpleNamespace(load=lambda: (_ for _ in ()).throw(RPCError("down")))
    with pytest.raises(SlurmCommandError, match="down"):
        PyslurmBackend(cli=CliBackend(), pyslurm=mod).nodes()


def test_actions() -> None:
    StubJob.calls.clear()
    StubNode.modified.clear()
    backend = make()
    backend.cancel("3")
    backend.cancel("3", signal="SIGTERM", batch_only=True)
    backend.requeue("3")
    backend.set_node_state("n[1-2]", "drain", "reclaim")
    assert StubJob.calls == [("cancel", 3), ("signal", (3, "SIGTERM", "batch")), ("requeue", 3)]
    assert StubNode.modified == [("n1", "DRAIN", "reclaim"), ("n2", "DRAIN", "reclaim")]


@pytest.mark.skipif(importlib.util.find_spec("pyslurm") is not None, reason="pyslurm is installed")
def test_import_without_pyslurm() -> None:
    with pytest.raises(ImportError):
        import_pyslurm()
