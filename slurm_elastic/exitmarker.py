"""Where an agent leaves its exit code for what started it: srun's own status is unreliable once Slurm
cancelled a step (a shrink, a preemption), so the launcher and the satellite's batch script read the
agent's own word.

- A core job's agents: `<job dir>/exits/<node>` (SLURM_ELASTIC_EXIT_DIR); the launcher reads them.
- A satellite's agent: `<core job dir>/satellite-exits/<satellite job id>` (SLURM_ELASTIC_EXIT_MARKER);
  elastic_satellite.sbatch asks `python -m slurm_elastic.exitmarker CORE_JOB SATELLITE_JOB` for the path.

Both lie in the user's own private job directory, never in a shared one such as /tmp, and are written as
every file there is (`write_private`): a name planted where a marker goes is replaced, never written through.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from slurm_elastic.errors import ElasticError
from slurm_elastic.jobdir import check_job_dir, job_dir, plain_name, private_dir, read_private, write_private
from slurm_elastic.logs import get_logger

__all__ = [
    "fresh_core_exits",
    "markers",
    "read_exit_code",
    "read_exit_reason",
    "satellite_marker",
    "write_exit_code",
]

log = get_logger("slurm_elastic.exitmarker")
EXITS = "exits"
SATELLITE_EXITS = "satellite-exits"
REASON_CHARS = 500


def markers(env: Mapping[str, str], node: str) -> list[Path]:
    """Where an agent on `node` leaves its exit code: the satellite's marker and/or the core job's
    `exits/<node>`, as its environment says."""
    out = []
    if env.get("SLURM_ELASTIC_EXIT_MARKER"):
        out.append(Path(env["SLURM_ELASTIC_EXIT_MARKER"]))
    if env.get("SLURM_ELASTIC_EXIT_DIR"):
        out.append(Path(env["SLURM_ELASTIC_EXIT_DIR"]) / plain_name("node name", node))
    return out


def write_exit_code(env: Mapping[str, str], node: str, code: int, reason: str = "") -> None:
    """Leave `code` at every marker of `env`, with `reason` (one line) on the line after it where the agent
    could not even start; a marker that cannot be written is logged, never fatal."""
    try:
        paths = markers(env, node)
    except ElasticError as exc:
        log.warning("exit_marker_not_written", node=node, error=str(exc))
        return
    for path in paths:
        try:
            _check_private(path.parent)
            line = " ".join(reason.split())[:REASON_CHARS]
            write_private(path.parent, path.name, f"{code}\n{line}\n".encode() if line else f"{code}\n".encode())
        except (OSError, ElasticError) as exc:
            log.warning("exit_marker_not_written", node=node, path=str(path), error=str(exc))


def _check_private(directory: Path) -> None:
    """A marker goes only into a directory that is already private to this user (never /tmp, never made
    private here: the path comes from the environment)."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ElasticError(f"refusing to leave an exit code in {directory}: it is not a private directory of yours")


def read_exit_code(path: Path) -> str:
    """The code an agent left at `path`: '' if there is none, or it is not a private file of this user."""
    return _read_lines(path)[0]


def read_exit_reason(path: Path) -> str:
    """Why the agent that left `path` could not start: '' if it did (or left no reason)."""
    return _read_lines(path)[1]


def _read_lines(path: Path) -> tuple[str, str]:
    try:
        text = read_private(path)[: 32 + REASON_CHARS * 4].decode(errors="replace")
    except (OSError, ElasticError):
        return "", ""
    code, _, reason = text.partition("\n")
    return code.strip()[:16], " ".join(reason.split())[:REASON_CHARS]


def fresh_core_exits(directory: Path) -> Path:
    """The core job's `exits/` in its directory `directory`, emptied: a requeued run's agents report afresh."""
    shutil.rmtree(directory / EXITS, ignore_errors=True)
    return private_dir(directory / EXITS)


def satellite_marker(core_job: str, satellite_job: str, root: Path | None = None) -> Path:
    """The marker of satellite job `satellite_job` of `core_job`; its directory is made (owner-only) in the
    core job's directory, and a marker left there before (by the satellite's previous run) is removed."""
    directory = job_dir(core_job, root)
    if not check_job_dir(directory):
        raise ElasticError(f"no job {core_job!r} under {directory.parent}: is SLURM_ELASTIC_HOME the core job's?")
    path = private_dir(directory / SATELLITE_EXITS) / plain_name("satellite job id", satellite_job)
    path.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurm_elastic.exitmarker",
        description="Print where the agent of a satellite job leaves its exit code (elastic_satellite.sbatch).",
    )
    parser.add_argument("core_job", help="the core job's id (SLURM_ELASTIC_CORE_JOB)")
    parser.add_argument("satellite_job", help="the satellite's own Slurm job id (SLURM_JOB_ID)")
    args = parser.parse_args(argv)
    try:
        path = satellite_marker(args.core_job, args.satellite_job)
    except (ElasticError, OSError) as exc:
        print(f"slurm-elastic: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
