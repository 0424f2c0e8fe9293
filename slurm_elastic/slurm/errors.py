"""Errors of the Slurm boundary; all are `slurm_elastic.errors.SlurmError`s."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_elastic.errors import SlurmError, SlurmParseError

__all__ = ["JobNotFound", "SlurmCommandError", "SlurmError", "SlurmParseError", "SlurmRequestError", "SlurmTimeout"]


class JobNotFound(SlurmError):
    """Slurm no longer knows the job (never existed, or purged after MinJobAge)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"Slurm does not know job {job_id!r} (never submitted, or already purged)")
        self.job_id = job_id


class SlurmCommandError(SlurmError):
    """A Slurm command exited non-zero, timed out, or could not be started."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, why: str = "") -> None:
        first = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
        what = why or (f"exited {returncode}" if returncode is not None else "failed")
        detail = f": {first}" if first else ""
        super().__init__(f"`{' '.join(argv)}` {what}{detail}")
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


class SlurmTimeout(SlurmCommandError):
    """A Slurm command did not finish in its time (slurmctld busy, restarting, or unreachable)."""


class SlurmRequestError(SlurmError):
    """A request to Slurm was malformed before any command ran (bad state name, empty node list, ...)."""
