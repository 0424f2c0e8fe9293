"""The one interface to Slurm (`SlurmBackend`), shared request checks, and the pure srun builder."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import SlurmRequestError
from .hostlist import compress_hostlist, expand_hostlist
from .records import JobInfo, NodeInfo, SlurmVersion

__all__ = [
    "NODE_UPDATE_STATES",
    "SlurmBackend",
    "check_node_update",
    "filter_jobs",
    "node_names",
    "srun_argv",
]

# States `scontrol update NodeName=... State=` accepts that this project uses; DRAIN, DOWN and FAIL
# need a reason (Slurm refuses them without one).
NODE_UPDATE_STATES = frozenset({"DRAIN", "UNDRAIN", "RESUME", "DOWN", "FAIL", "IDLE"})
_NEEDS_REASON = frozenset({"DRAIN", "DOWN", "FAIL"})


@runtime_checkable
class SlurmBackend(Protocol):
    """Everything slurm-elastic asks of Slurm. Implementations: CliBackend, PyslurmBackend, FakeSlurm."""

    def version(self) -> SlurmVersion:
        """The Slurm release the client tools belong to."""
        ...

    def job(self, job_id: str) -> JobInfo:
        """One job; raises JobNotFound when Slurm no longer knows it."""
        ...

    def jobs(
        self, *, user: str | None = None, name: str | None = None, states: Iterable[str] | None = None
    ) -> list[JobInfo]:
        """Jobs Slurm still knows, filtered by user, exact name and state words (any of them)."""
        ...

    def nodes(self, names: Iterable[str] | str | None = None) -> list[NodeInfo]:
        """Nodes, all or those named (a list or a hostlist expression)."""
        ...

    def submit(
        self,
        script: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        test_only: bool = False,
        script_args: Sequence[str] = (),
    ) -> str:
        """`sbatch [args] script`; returns the job id. `args` are sbatch options, put before the script;
        `env` is added to the caller's environment. With `test_only` nothing is queued: the id Slurm
        reports for the estimate is returned, or SlurmError raised if the job could never run."""
        ...

    def cancel(self, job_id: str, *, signal: str | int | None = None, batch_only: bool = False) -> None:
        """Cancel a job, or with `signal` only signal it (`batch_only`: the batch shell alone)."""
        ...

    def requeue(self, job_id: str) -> None:
        """Put a running (or finished batch) job back to PENDING; its restart count goes up by one."""
        ...

    def resize_job(
        self, job_id: str, *, num_nodes: int | None = None, nodelist: Iterable[str] | str | None = None
    ) -> None:
        """Shrink a running job (`scontrol update JobId= NumNodes=|NodeList=`); the batch host stays."""
        ...

    def set_comment(self, job_id: str, comment: str) -> None:
        """`scontrol update JobId=X Comment=...`: how hooks find an elastic job's coordinator."""
        ...

    def set_node_state(self, names: Iterable[str] | str, state: str, reason: str) -> None:
        """`scontrol update NodeName=... State=... Reason=...` (DRAIN, RESUME, DOWN, ...)."""
        ...

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a hostlist expression (`scontrol show hostnames`)."""
        ...


def node_names(names: Iterable[str] | str) -> list[str]:
    """A hostlist expression or an iterable of names (each may itself be an expression) -> names."""
    if isinstance(names, str):
        return expand_hostlist(names)
    out: list[str] = []
    for name in names:
        out.extend(expand_hostlist(name))
    return out


def check_node_update(names: Iterable[str] | str, state: str, reason: str) -> tuple[str, str]:
    """Validate a node update; returns (compressed hostlist, upper-case state)."""
    wanted = state.strip().upper()
    if wanted not in NODE_UPDATE_STATES:
        raise SlurmRequestError(f"node state {state!r} is not one of {', '.join(sorted(NODE_UPDATE_STATES))}")
    if wanted in _NEEDS_REASON and not reason.strip():
        raise SlurmRequestError(f"node state {wanted} needs a non-empty reason")
    expanded = node_names(names)
    if not expanded:
        raise SlurmRequestError(f"no node named in {names!r}")
    return compress_hostlist(expanded), wanted


def filter_jobs(
    jobs: Iterable[JobInfo],
    *,
    user: str | None = None,
    name: str | None = None,
    states: Iterable[str] | None = None,
) -> list[JobInfo]:
    """Client-side filter (22.05's `squeue --json` ignores its filters). A state matches the job's
    shown state, its base state or any of its flags."""
    wanted = {s.upper() for s in states} if states is not None else None
    out = []
    for job in jobs:
        if user is not None and job.user != user:
            continue
        if name is not None and job.name != name:
            continue
        if wanted is not None and not ({job.state, job.base_state, *job.flags} & wanted):
            continue
        out.append(job)
    return out


def srun_argv(
    command: Sequence[str],
    *,
    nodes: int | None,
    nodelist: Iterable[str] | str | None = None,
    ntasks_per_node: int = 1,
    no_kill: bool = True,
    kill_on_bad_exit: int = 0,
    extra: Sequence[str] = (),
) -> list[str]:
    """`srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 [--nodes=N] [--nodelist=..] ... cmd`.

    `--no-kill` keeps the step alive when one of its nodes fails, and `--kill-on-bad-exit=0` keeps
    one task's failure from killing the others: the survivors re-form the group themselves.
    """
    if not command or not command[0] or command[0].startswith("-"):
        raise SlurmRequestError(f"srun needs a command whose first word is a program, got {list(command)!r}")
    if nodes is not None and nodes < 1:
        raise SlurmRequestError(f"srun --nodes must be at least 1, got {nodes}")
    if ntasks_per_node < 1:
        raise SlurmRequestError(f"srun --ntasks-per-node must be at least 1, got {ntasks_per_node}")
    argv = ["srun"]
    if no_kill:
        argv.append("--no-kill")
    argv += [f"--kill-on-bad-exit={kill_on_bad_exit}", f"--ntasks-per-node={ntasks_per_node}"]
    if nodes is not None:
        argv.append(f"--nodes={nodes}")
    if nodelist is not None:
        names = node_names(nodelist)
        if not names:
            raise SlurmRequestError("srun --nodelist is empty")
        argv.append(f"--nodelist={compress_hostlist(names)}")
    argv += list(extra)
    argv += list(command)
    return argv
