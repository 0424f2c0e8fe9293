"""The behavioural contract every SlurmBackend keeps, runnable against the fake and a real cluster.

Each check takes a `Harness` (a backend plus a way to wait without the check knowing whether time is
real) and raises AssertionError on a breach. Tests parametrize over `CHECKS`; shipping them here lets
later code reuse them against its own doubles.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.errors import JobNotFound
from slurm_elastic.slurm.records import JobInfo, SlurmVersion

__all__ = ["CHECKS", "Harness"]


class Harness(Protocol):
    backend: SlurmBackend
    nodes: tuple[str, ...]  # the test partition's nodes, at least three, all usable at the start

    def script(self, body: str = "sleep 300") -> Path:
        """A batch script file that runs `body`."""
        ...

    def wait_for(self, job_id: str, predicate: Callable[[JobInfo], bool], what: str) -> JobInfo:
        """Let time pass (or the fake schedule) until `predicate(job)` holds; fail naming `what`."""
        ...


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _name() -> str:
    return f"contract-{uuid.uuid4().hex[:8]}"


def _submit(h: Harness, name: str, nodes: int = 1, *extra: str) -> str:
    job_id = h.backend.submit(h.script(), args=[f"--job-name={name}", f"--nodes={nodes}", "--exclusive", *extra])
    _expect(job_id.isdigit(), f"submit returned {job_id!r}, expected digits")
    return job_id


def _cleanup(h: Harness, job_id: str) -> None:
    with contextlib.suppress(JobNotFound):
        h.backend.cancel(job_id)


def check_version(h: Harness) -> None:
    version = h.backend.version()
    _expect(version >= SlurmVersion(22, 5, 0), f"version {version} older than 22.05")


def check_nodes_and_hostnames(h: Harness) -> None:
    names = {n.name for n in h.backend.nodes()}
    _expect(set(h.nodes) <= names, f"nodes() lacks some of {h.nodes}: {sorted(names)}")
    one = h.backend.nodes([h.nodes[0]])
    _expect([n.name for n in one] == [h.nodes[0]], f"nodes([{h.nodes[0]}]) gave {one}")
    _expect(h.backend.hostnames("x[1-2],y") == ["x1", "x2", "y"], "hostnames('x[1-2],y') wrong")


def check_unknown_job(h: Harness) -> None:
    try:
        h.backend.job("999999")
    except JobNotFound:
        return
    raise AssertionError("job('999999') did not raise JobNotFound")


def check_submit_and_cancel(h: Harness) -> None:
    name = _name()
    job_id = _submit(h, name)
    try:
        job = h.backend.job(job_id)
        _expect(job.job_id == job_id and job.name == name, f"job({job_id}) gave {job}")
        _expect(job.state in {"PENDING", "RUNNING", "CONFIGURING"}, f"fresh job in state {job.state}")
        listed = [j.job_id for j in h.backend.jobs(name=name)]
        _expect(listed == [job_id], f"jobs(name={name!r}) gave {listed}")
        h.backend.cancel(job_id)
        h.wait_for(job_id, lambda j: "CANCELLED" in {j.state, j.base_state}, "CANCELLED after cancel")
    finally:
        _cleanup(h, job_id)


def check_test_only(h: Harness) -> None:
    name = _name()
    reported = h.backend.submit(h.script(), args=[f"--job-name={name}", "--nodes=1"], test_only=True)
    _expect(reported.isdigit(), f"test_only submit returned {reported!r}")
    _expect(h.backend.jobs(name=name) == [], "test_only submit queued a job")


def check_resize_keeps_batch_host(h: Harness) -> None:
    job_id = _submit(h, _name(), 3, "--no-kill")
    try:
        running = h.wait_for(job_id, lambda j: j.state == "RUNNING" and len(j.nodes) == 3, "RUNNING on 3")
        h.backend.resize_job(job_id, num_nodes=1)
        shrunk = h.wait_for(job_id, lambda j: j.num_nodes == 1, "1 node after resize")
        _expect(shrunk.nodes == (running.batch_host,), f"shrunk to {shrunk.nodes}, not the batch host")
        _expect(shrunk.state == "RUNNING", f"job {shrunk.state} after shrink")
    finally:
        _cleanup(h, job_id)


def check_drain_and_resume(h: Harness) -> None:
    node = h.nodes[-1]
    h.backend.set_node_state(node, "DRAIN", "contract check")
    try:
        (info,) = h.backend.nodes([node])
        _expect(info.drain and info.reason == "contract check", f"after DRAIN: {info}")
    finally:
        h.backend.set_node_state([node], "RESUME", "")
    (info,) = h.backend.nodes([node])
    _expect(not info.drain, f"after RESUME: {info}")


def check_requeue(h: Harness) -> None:
    job_id = _submit(h, _name(), 1, "--requeue")
    try:
        h.wait_for(job_id, lambda j: j.state == "RUNNING", "RUNNING")
        h.backend.requeue(job_id)
        back = h.wait_for(job_id, lambda j: j.state == "PENDING", "PENDING after requeue")
        _expect(back.restart_count == 1, f"restart_count {back.restart_count} after one requeue")
        _expect(back.nodes == (), f"requeued job still holds {back.nodes}")
    finally:
        _cleanup(h, job_id)


CHECKS: dict[str, Callable[[Harness], None]] = {
    "version": check_version,
    "nodes_and_hostnames": check_nodes_and_hostnames,
    "unknown_job": check_unknown_job,
    "submit_and_cancel": check_submit_and_cancel,
    "test_only": check_test_only,
    "resize_keeps_batch_host": check_resize_keeps_batch_host,
    "drain_and_resume": check_drain_and_resume,
    "requeue": check_requeue,
}
