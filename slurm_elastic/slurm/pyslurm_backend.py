"""`PyslurmBackend`: SlurmBackend over pyslurm's object API (pyslurm 25.11, for Slurm 25.11 only).

Written against pyslurm's documented API (`pyslurm.Job.load`, `pyslurm.Jobs.load`, `pyslurm.Nodes.load`,
`Job.cancel/send_signal/requeue`, `Node.modify(pyslurm.Node(state=, reason=))`); it cannot be tested
on the Slurm releases this project runs on. What pyslurm has no call for (sbatch of a script file,
the version of the client tools, shrinking a job) goes through the CLI backend, as do hostlists.
pyslurm is imported only when the backend is created, so this module imports without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .backend import check_node_update, filter_jobs, node_names
from .cli_backend import CliBackend
from .errors import JobNotFound, SlurmCommandError
from .hostlist import expand_hostlist
from .records import JobInfo, NodeInfo, SlurmVersion
from .states import job_state, node_state

__all__ = ["PyslurmBackend", "import_pyslurm"]


def import_pyslurm() -> Any:
    """Import pyslurm, or raise ImportError (also for a pyslurm built against another Slurm)."""
    try:
        return importlib.import_module("pyslurm")
    except ImportError:
        raise
    except Exception as exc:  # a mismatched libslurm fails at import with OSError and others
        raise ImportError(f"pyslurm is installed but does not load: {exc}") from exc


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class PyslurmBackend:
    """Reads and job/node actions through pyslurm; submit, resize and version through `cli`."""

    def __init__(self, *, cli: CliBackend | None = None, pyslurm: Any = None) -> None:
        self._ps = pyslurm if pyslurm is not None else import_pyslurm()
        self._cli = cli or CliBackend()

    def _call(self, what: str, fn: Any, *args: Any, job_id: str | None = None) -> Any:
        try:
            return fn(*args)
        except self._ps.RPCError as exc:
            if job_id is not None and "Invalid job id" in str(exc):
                raise JobNotFound(job_id) from exc
            raise SlurmCommandError([f"pyslurm {what}"], None, str(exc)) from exc

    def _job(self, job: Any) -> JobInfo:
        state, base, flags = job_state(_text(job.state))
        nodes = _text(job.allocated_nodes)
        het = getattr(job, "het_job_id", None)
        return JobInfo(
            job_id=str(job.id),
            name=_text(job.name),
            user=_text(job.user_name),
            state=state,
            base_state=base,
            flags=flags,
            partition=_text(job.partition),
            nodes=tuple(expand_hostlist(nodes)) if nodes else (),
            num_nodes=int(job.num_nodes or 0),
            batch_host=_text(job.batch_host) or None,
            restart_count=int(job.requeue_count or 0),
            work_dir=_text(job.working_directory),
            comment=_text(job.comment),
            reason="" if _text(job.state_reason) == "None" else _text(job.state_reason),
            time_limit_minutes=job.time_limit if isinstance(job.time_limit, int) else None,
            array_job_id=_text(getattr(job, "array_id", None)) or None,
            array_task_id=_text(getattr(job, "array_task_id", None)) or None,
            het_job_id=str(het) if het else None,
            het_job_offset=getattr(job, "het_job_offset", None) if het else None,
        )

    def version(self) -> SlurmVersion:
        return self._cli.version()

    def job(self, job_id: str) -> JobInfo:
        return self._job(self._call("Job.load", self._ps.Job.load, int(job_id), job_id=str(job_id)))

    def jobs(
        self, *, user: str | None = None, name: str | None = None, states: Iterable[str] | None = None
    ) -> list[JobInfo]:
        loaded = self._call("Jobs.load", self._ps.Jobs.load)
        return filter_jobs((self._job(j) for j in loaded.values()), user=user, name=name, states=states)

    def nodes(self, names: Iterable[str] | str | None = None) -> list[NodeInfo]:
        loaded = self._call("Nodes.load", self._ps.Nodes.load)
        wanted = set(node_names(names)) if names is not None else None
        out = []
        for node in loaded.values():
            if wanted is not None and node.name not in wanted:
                continue
            base, flags = node_state(_text(node.state))
            partitions = tuple(node.partitions or ())
            out.append(NodeInfo(node.name, base, flags, _text(node.reason), partitions))
        return out

    def submit(
        self,
        script: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        test_only: bool = False,
        script_args: Sequence[str] = (),
    ) -> str:
        return self._cli.submit(script, args=args, env=env, test_only=test_only, script_args=script_args)

    def cancel(self, job_id: str, *, signal: str | int | None = None, batch_only: bool = False) -> None:
        job = self._ps.Job(int(job_id))
        if signal is None and not batch_only:
            self._call("Job.cancel", job.cancel, job_id=str(job_id))
            return
        steps = "batch" if batch_only else "children"
        self._call("Job.send_signal", job.send_signal, signal or 9, steps, job_id=str(job_id))

    def requeue(self, job_id: str) -> None:
        self._call("Job.requeue", self._ps.Job(int(job_id)).requeue, job_id=str(job_id))

    def resize_job(
        self, job_id: str, *, num_nodes: int | None = None, nodelist: Iterable[str] | str | None = None
    ) -> None:
        self._cli.resize_job(job_id, num_nodes=num_nodes, nodelist=nodelist)

    def set_comment(self, job_id: str, comment: str) -> None:
        self._cli.set_comment(job_id, comment)

    def set_node_state(self, names: Iterable[str] | str, state: str, reason: str) -> None:
        hostlist, wanted = check_node_update(names, state, reason)
        changes = self._ps.Node(state=wanted, reason=reason.strip() or None)
        for name in expand_hostlist(hostlist):
            self._call("Node.modify", self._ps.Node(name).modify, changes)

    def hostnames(self, hostlist: str) -> list[str]:
        return expand_hostlist(hostlist)
