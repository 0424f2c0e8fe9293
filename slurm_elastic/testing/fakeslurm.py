"""`FakeSlurm`: an in-memory SlurmBackend for unit tests, modelled on what real Slurm did here.

Semantics (see DESIGN.md section 3): one job per node; shrinking keeps the batch host; cancel ->
CANCELLED; requeue -> PENDING with restart_count+1, eligible again after `requeue_delay` seconds;
a node that fails or is set DOWN ends its jobs with NODE_FAIL, except `--no-kill` jobs, which lose
only that node (or die with NODE_FAIL if it was the batch host). Time comes from an injected clock;
nothing sleeps. Scheduling happens only in `start_pending()`, so tests decide when jobs start.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurm_elastic.slurm.backend import check_node_update, filter_jobs, node_names
from slurm_elastic.slurm.errors import JobNotFound, SlurmCommandError, SlurmRequestError
from slurm_elastic.slurm.hostlist import expand_hostlist
from slurm_elastic.slurm.records import JOB_TERMINAL_STATES, JobInfo, NodeInfo, SlurmVersion

__all__ = ["FakeClock", "FakeSlurm"]

_DEFAULT_VERSION = SlurmVersion(22, 5, 8)  # Debian 12's release, the one this project runs on


class FakeClock:
    """A settable clock: `now()` returns the current fake time, `advance(seconds)` moves it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2024, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)


@dataclass
class _Node:
    name: str
    state: str = "IDLE"
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    partitions: tuple[str, ...] = ()


@dataclass
class _Job:
    info: JobInfo
    no_kill: bool = False
    requeue_allowed: bool = True
    eligible_at: datetime | None = None
    wanted_nodelist: tuple[str, ...] = ()


def _sbatch_options(script: Path, args: Sequence[str]) -> dict[str, str]:
    """The few sbatch options the fake understands, from `#SBATCH` lines then `args` (args win)."""
    words: list[str] = []
    try:
        for line in script.read_text().splitlines():
            if line.startswith("#SBATCH"):
                words += shlex.split(line[len("#SBATCH") :])
            elif line.strip() and not line.startswith("#"):
                break  # sbatch stops reading directives at the first command
    except OSError as exc:
        raise SlurmRequestError(f"cannot read batch script {str(script)!r}: {exc.strerror}") from exc
    words += list(args)
    short = {"-N": "nodes", "-J": "job-name", "-p": "partition", "-w": "nodelist", "-k": "no-kill"}
    opts: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in short:
            key = short[word]
            if key == "no-kill":
                opts[key] = ""
            elif i + 1 < len(words):
                opts[key] = words[i + 1]
                i += 1
        elif word.startswith("--"):
            key, _, value = word[2:].partition("=")
            opts[key] = value
        i += 1
    return opts


class FakeSlurm:
    """In-memory Slurm: nodes `n[1-4]` in partition `train` unless told otherwise."""

    def __init__(
        self,
        nodes: Iterable[str] | str = "n[1-4]",
        *,
        partitions: Mapping[str, Iterable[str] | str] | None = None,
        version: SlurmVersion = _DEFAULT_VERSION,
        clock: Callable[[], datetime] | None = None,
        user: str = "user",
        requeue_delay: float = 120.0,
        first_job_id: int = 1,
    ) -> None:
        names = node_names(nodes)
        parts = {k: node_names(v) for k, v in (partitions or {"train": names}).items()}
        self._partitions = parts
        self._nodes = {n: _Node(n, partitions=tuple(p for p, members in parts.items() if n in members)) for n in names}
        self._jobs: dict[str, _Job] = {}
        self._version = version
        self._clock = clock or FakeClock().now
        self._user = user
        self._requeue_delay = timedelta(seconds=requeue_delay)
        self._next_id = first_job_id
        self.signals: list[tuple[str, str | int, bool]] = []  # (job_id, signal, batch_only) sent

    # -- reads ------------------------------------------------------------------------------------

    def version(self) -> SlurmVersion:
        return self._version

    def job(self, job_id: str) -> JobInfo:
        return self._get(job_id).info

    def jobs(
        self, *, user: str | None = None, name: str | None = None, states: Iterable[str] | None = None
    ) -> list[JobInfo]:
        return filter_jobs((j.info for j in self._jobs.values()), user=user, name=name, states=states)

    def nodes(self, names: Iterable[str] | str | None = None) -> list[NodeInfo]:
        wanted = node_names(names) if names is not None else list(self._nodes)
        missing = [n for n in wanted if n not in self._nodes]
        if missing:
            raise SlurmCommandError(["scontrol", "show", "node", *missing], 1, f"Node {missing[0]} not found")
        return [self._node_info(self._nodes[n]) for n in wanted]

    def hostnames(self, hostlist: str) -> list[str]:
        return expand_hostlist(hostlist)

    # -- actions ----------------------------------------------------------------------------------

    def submit(
        self,
        script: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        test_only: bool = False,
        script_args: Sequence[str] = (),
        user: str | None = None,
    ) -> str:
        """`user`: the fake's own extra, a job that another user submitted (default: the fake's user)."""
        opts = _sbatch_options(Path(script), args)
        partition = opts.get("partition") or next(iter(self._partitions))
        nodelist = tuple(expand_hostlist(opts["nodelist"])) if opts.get("nodelist") else ()
        m = re.match(r"\d+", opts.get("nodes", ""))
        count = int(m.group(0)) if m else max(1, len(nodelist))
        members = self._partitions.get(partition)
        if members is None or count > len(members) or not set(nodelist) <= set(members):
            raise SlurmCommandError(
                ["sbatch", *args, str(script)],
                1,
                "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            )
        job_id = str(self._next_id)
        if test_only:
            return job_id
        self._next_id += 1
        info = JobInfo(
            job_id=job_id,
            name=opts.get("job-name") or Path(script).name,
            user=user or self._user,
            state="PENDING",
            base_state="PENDING",
            partition=partition,
            num_nodes=count,
            work_dir=str((env or {}).get("PWD", "/tmp")),
            comment=opts.get("comment", ""),
            submit_time=self._clock(),
        )
        self._jobs[job_id] = _Job(
            info,
            no_kill="no-kill" in opts,
            requeue_allowed="no-requeue" not in opts,
            wanted_nodelist=nodelist,
        )
        return job_id

    def cancel(self, job_id: str, *, signal: str | int | None = None, batch_only: bool = False) -> None:
        job = self._get(job_id)
        if signal is not None:
            if job.info.state in JOB_TERMINAL_STATES:
                raise SlurmCommandError(["scancel", job_id], 1, "Job/step already completing or completed")
            self.signals.append((job_id, signal, batch_only))
            return
        if job.info.state not in JOB_TERMINAL_STATES:
            self._end(job, "CANCELLED")

    def requeue(self, job_id: str) -> None:
        job = self._get(job_id)
        if job.info.state == "PENDING":
            raise SlurmCommandError(["scontrol", "requeue", job_id], 1, "Job is pending execution")
        if not job.requeue_allowed:
            raise SlurmCommandError(["scontrol", "requeue", job_id], 1, "Requested operation is disabled")
        self._release_nodes(job.info.nodes)
        job.eligible_at = self._clock() + self._requeue_delay
        job.info = replace(
            job.info,
            state="PENDING",
            base_state="PENDING",
            flags=frozenset(),
            nodes=(),
            batch_host=None,
            restart_count=job.info.restart_count + 1,
            reason="BeginTime",
            start_time=None,
        )

    def resize_job(
        self, job_id: str, *, num_nodes: int | None = None, nodelist: Iterable[str] | str | None = None
    ) -> None:
        job = self._get(job_id)
        argv = ["scontrol", "update", f"JobId={job_id}"]
        if num_nodes is None and nodelist is None:
            raise SlurmRequestError("resize_job needs num_nodes or nodelist")
        if job.info.state != "RUNNING":
            raise SlurmCommandError(argv, 1, "Job is not running")
        current = list(job.info.nodes)
        keep = node_names(nodelist) if nodelist is not None else None
        if keep is None:
            if num_nodes is None or num_nodes < 1 or num_nodes > len(current):
                raise SlurmCommandError(argv, 1, "Requested node configuration is not available")
            # The batch host always stays; then the job's other nodes in order.
            host = job.info.batch_host or current[0]
            keep = [host, *[n for n in current if n != host][: num_nodes - 1]]
        if not keep or not set(keep) <= set(current) or job.info.batch_host not in keep:
            raise SlurmCommandError(argv, 1, "Invalid node name specified (NodeList must keep the batch host)")
        if num_nodes is not None and num_nodes != len(keep):
            raise SlurmCommandError(argv, 1, "NumNodes does not match NodeList")
        kept = tuple(n for n in current if n in keep)
        self._release_nodes(tuple(n for n in current if n not in keep))
        job.info = replace(job.info, nodes=kept, num_nodes=len(kept))

    def set_comment(self, job_id: str, comment: str) -> None:
        job = self._get(job_id)
        job.info = replace(job.info, comment=comment)

    def set_node_state(self, names: Iterable[str] | str, state: str, reason: str) -> None:
        hostlist, wanted = check_node_update(names, state, reason)
        targets = expand_hostlist(hostlist)
        unknown = [n for n in targets if n not in self._nodes]
        if unknown:
            raise SlurmCommandError(["scontrol", "update", f"NodeName={hostlist}"], 1, "Invalid node name")
        for name in targets:
            node = self._nodes[name]
            if wanted == "DRAIN":
                node.flags.add("DRAIN")
                node.reason = reason.strip()
            elif wanted == "FAIL":
                node.flags.add("FAIL")
                node.reason = reason.strip()
            elif wanted in {"UNDRAIN", "RESUME", "IDLE"}:
                node.flags -= {"DRAIN", "FAIL"}
                if wanted != "UNDRAIN" and node.state == "DOWN":
                    node.state = "IDLE"
                    node.flags.discard("NOT_RESPONDING")
                node.reason = "" if wanted != "UNDRAIN" or node.state != "DOWN" else node.reason
            elif wanted == "DOWN":
                self._node_down(node, reason.strip(), not_responding=False)

    # -- simulated events -------------------------------------------------------------------------

    def start_pending(self) -> list[str]:
        """Start eligible pending jobs in submission order on free usable nodes; returns their ids."""
        started = []
        for job in self._jobs.values():
            info = job.info
            if info.state != "PENDING" or (job.eligible_at and self._clock() < job.eligible_at):
                continue
            free = [
                n
                for n in self._partitions[info.partition]
                if self._nodes[n].state == "IDLE" and not self._nodes[n].flags & {"DRAIN", "FAIL"}
            ]
            if job.wanted_nodelist:
                if not set(job.wanted_nodelist) <= set(free):
                    continue
                chosen = list(job.wanted_nodelist)
            elif len(free) >= info.num_nodes:
                chosen = free[: info.num_nodes]
            else:
                continue
            for name in chosen:
                self._nodes[name].state = "ALLOCATED"
            job.info = replace(
                info,
                state="RUNNING",
                base_state="RUNNING",
                nodes=tuple(chosen),
                batch_host=chosen[0],
                reason="",
                start_time=self._clock(),
            )
            started.append(info.job_id)
        return started

    def fail_node(self, name: str, reason: str = "Not responding") -> None:
        """The node's slurmd died: DOWN+NOT_RESPONDING; its jobs lose it (see module doc)."""
        self._node_down(self._nodes[name], reason, not_responding=True)

    def restore_node(self, name: str) -> None:
        """slurmd is back (ReturnToService=2): a DOWN node returns IDLE."""
        node = self._nodes[name]
        node.flags.discard("NOT_RESPONDING")
        if node.state == "DOWN":
            node.state, node.reason = "IDLE", ""

    def preempt(self, job_id: str, *, requeue: bool = True) -> None:
        """Preempt a job (PreemptMode=REQUEUE): back to PENDING with restart+1, or PREEMPTED."""
        job = self._get(job_id)
        if requeue and job.requeue_allowed:
            self.requeue(job_id)
        else:
            self._end(job, "PREEMPTED")

    def finish(self, job_id: str, state: str = "COMPLETED") -> None:
        """The batch script ended (COMPLETED, FAILED, TIMEOUT, ...)."""
        if state not in JOB_TERMINAL_STATES:
            raise SlurmRequestError(f"finish state {state!r} is not one of {sorted(JOB_TERMINAL_STATES)}")
        self._end(self._get(job_id), state)

    def purge(self, job_id: str) -> None:
        """Slurm forgot the job (MinJobAge passed): job() raises JobNotFound from now on."""
        self._get(job_id)
        del self._jobs[job_id]

    # -- internals --------------------------------------------------------------------------------

    def _get(self, job_id: str) -> _Job:
        job = self._jobs.get(str(job_id))
        if job is None:
            raise JobNotFound(str(job_id))
        return job

    def _node_info(self, node: _Node) -> NodeInfo:
        return NodeInfo(node.name, node.state, frozenset(node.flags), node.reason, node.partitions)

    def _release_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            if self._nodes[name].state == "ALLOCATED":
                self._nodes[name].state = "IDLE"

    def _end(self, job: _Job, state: str) -> None:
        self._release_nodes(job.info.nodes)
        job.info = replace(job.info, state=state, base_state=state, flags=frozenset())

    def _node_down(self, node: _Node, reason: str, *, not_responding: bool) -> None:
        node.state, node.reason = "DOWN", reason
        if not_responding:
            node.flags.add("NOT_RESPONDING")
        for job in self._jobs.values():
            if job.info.state != "RUNNING" or node.name not in job.info.nodes:
                continue
            if job.no_kill and node.name != job.info.batch_host:
                kept = tuple(n for n in job.info.nodes if n != node.name)
                job.info = replace(job.info, nodes=kept, num_nodes=len(kept))
            else:
                self._end(job, "NODE_FAIL")
                node.state = "DOWN"
