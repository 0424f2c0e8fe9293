"""The hooks' Slurm queries: literal outputs of 22.05, injected lines, and the exact commands run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from slurm_elastic.hooks.slurmq import HookSlurm, parse_jobs_on_node, parse_spool_dir
from slurm_elastic.slurm.cli_backend import CommandResult
from slurm_elastic.slurm.errors import SlurmCommandError

# `scontrol show node -o n3` on 22.05.8 while an admin had set State=FAIL under a running job.
NODE_FAIL_2205 = (
    "NodeName=n3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=2.90 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=17003 Version=22.05.8 OS=Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000 AllocMem=0 "
    "FreeMem=22062 Sockets=2 Boards=1 State=MIXED+FAIL ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=train,infer  BootTime=2026-11-29T14:34:36 SlurmdStartTime=2026-11-29T15:30:02 "
    "LastBusyTime=2026-11-29T15:30:09 CfgTRES=cpu=2,mem=4000M,billing=2 AllocTRES=cpu=1 CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=test fail [root@2026-11-29T15:30:56]\n"
)
JOB_2205 = (
    'JobId=7 JobName=evil $(id) `x` "q" ; name UserId=root(0) GroupId=root(0) MCS_label=N/A JobState=RUNNING '
    "Reason=None Dependency=(null) Partition=train NodeList=n[1-2] BatchHost=n1 NumNodes=2 "
    "Comment=slurm-elastic:/tmp/j/coordinator.json  StdErr=/tmp/o StdIn=/dev/null StdOut=/tmp/o Power= \n"
)


class FakeRunner:
    def __init__(self, outputs: dict[str, CommandResult]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        assert timeout <= 5.0
        for prefix, result in self.outputs.items():
            if " ".join(argv).startswith(prefix):
                return result
        return CommandResult(1, "", f"unexpected {argv}")


def test_jobs_on_node_keeps_only_two_numbers_per_line() -> None:
    text = "12 1000\n13 0\n\n  14 1001  \n12 0 slurm-elastic:/x\nfoo 1\n15\n"
    assert parse_jobs_on_node(text) == [("12", 1000), ("13", 0), ("14", 1001)]


def test_spool_dir() -> None:
    text = "SlurmctldTimeout        = 30 sec\nSlurmdSpoolDir          = /work/main/.cluster/spool/%n\nX = 1\n"
    assert parse_spool_dir(text) == "/work/main/.cluster/spool/%n"
    assert parse_spool_dir("nothing") is None


def test_queries_use_text_mode_and_no_version_probe() -> None:
    runner = FakeRunner(
        {
            "scontrol show node -o n3": CommandResult(0, NODE_FAIL_2205, ""),
            "scontrol show job -o 7": CommandResult(0, JOB_2205, ""),
            "squeue -h -w n3": CommandResult(0, "7 0\n", ""),
        }
    )
    slurm = HookSlurm(runner=runner)
    node = slurm.node("n3")
    assert node is not None and node.state == "MIXED" and "FAIL" in node.flags and node.reason == "test fail"
    job = slurm.job("7")
    assert job is not None and job.comment == "slurm-elastic:/tmp/j/coordinator.json" and job.nodes == ("n1", "n2")
    assert slurm.running_jobs_on("n3") == [("7", 0)]
    assert runner.calls == [
        ["scontrol", "show", "node", "-o", "n3"],
        ["scontrol", "show", "job", "-o", "7"],
        ["squeue", "-h", "-w", "n3", "-t", "RUNNING", "-o", "%A %U"],
    ]


def test_gone_job_and_failing_commands() -> None:
    runner = FakeRunner(
        {
            "scontrol show job": CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n"),
            "squeue": CommandResult(1, "", "squeue: error: Unable to contact slurm controller\n"),
            "scontrol update": CommandResult(1, "", "slurm_update error: Invalid node state specified\n"),
        }
    )
    slurm = HookSlurm(runner=runner)
    assert slurm.job("7") is None
    with pytest.raises(SlurmCommandError):
        slurm.running_jobs_on("n3")
    with pytest.raises(SlurmCommandError):
        slurm.set_node_state("n3", "DRAIN", "slurm-elastic healthcheck: x")


def test_set_node_state_passes_the_reason_as_one_argument() -> None:
    runner = FakeRunner({"scontrol update": CommandResult(0, "", "")})
    HookSlurm(runner=runner).set_node_state("n3", "DRAIN", "slurm-elastic prolog: shm: 1 MB free in /dev/shm")
    assert runner.calls == [
        ["scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=slurm-elastic prolog: shm: 1 MB free in /dev/shm"]
    ]
