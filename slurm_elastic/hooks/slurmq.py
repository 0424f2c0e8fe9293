"""The few Slurm questions and actions of the hooks, each bounded by a short timeout.

Jobs and nodes go through the project's `CliBackend` in text mode: `scontrol show -o` prints the same
fields on every release we support, and forcing it saves a `scontrol --version` on every run of a
health check that may start every second. Two queries the backend has no method for (`squeue -w` and
`scontrol show config`) use its command runner directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from slurm_elastic.slurm.cli_backend import CliBackend, Runner, run_command
from slurm_elastic.slurm.errors import JobNotFound, SlurmCommandError
from slurm_elastic.slurm.records import JobInfo, NodeInfo, SlurmVersion

__all__ = ["HookSlurm", "parse_jobs_on_node", "parse_spool_dir"]

_TEXT_MODE = SlurmVersion(22, 5, 0)
_JOB_LINE = re.compile(r"([0-9]{1,10}) ([0-9]{1,10})")
_SPOOL = re.compile(r"^SlurmdSpoolDir\s*=\s*(/\S.*?)\s*$", re.MULTILINE)


def parse_jobs_on_node(text: str) -> list[tuple[str, int]]:
    """`squeue -h -o '%A %U'` -> [(job id, uid)]; any other line is skipped (it cannot come from those
    two numeric fields, so it is not trusted)."""
    out = []
    for line in text.splitlines():
        m = _JOB_LINE.fullmatch(line.strip())
        if m is not None:
            out.append((m.group(1), int(m.group(2))))
    return out


def parse_spool_dir(text: str) -> str | None:
    """`scontrol show config` -> the SlurmdSpoolDir template (may hold %n), or None."""
    m = _SPOOL.search(text)
    return m.group(1) if m else None


class HookSlurm:
    def __init__(self, *, timeout_s: float = 5.0, env: Mapping[str, str] | None = None, runner: Runner | None = None):
        self._timeout = timeout_s
        self._env = dict(env or {})
        self._runner: Runner = runner or run_command
        self._backend = CliBackend(timeout=timeout_s, env=self._env, runner=self._runner, version=_TEXT_MODE)

    def _command(self, *argv: str) -> str:
        import os

        result = self._runner(list(argv), {**os.environ, **self._env}, self._timeout)
        if result.returncode != 0:
            raise SlurmCommandError(list(argv), result.returncode, result.stderr or result.stdout)
        return result.stdout

    def job(self, job_id: str) -> JobInfo | None:
        """The job as slurmctld knows it now; None when it is gone."""
        try:
            return self._backend.job(job_id)
        except JobNotFound:
            return None

    def node(self, name: str) -> NodeInfo | None:
        found = self._backend.nodes([name])
        return found[0] if found else None

    def running_jobs_on(self, node: str) -> list[tuple[str, int]]:
        """(job id, uid) of every running job on `node`."""
        return parse_jobs_on_node(self._command("squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A %U"))

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        self._backend.set_node_state([node], state, reason)

    def spool_dir(self) -> str | None:
        return parse_spool_dir(self._command("scontrol", "show", "config"))
