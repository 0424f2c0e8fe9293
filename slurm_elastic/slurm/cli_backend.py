"""`CliBackend`: SlurmBackend over the Slurm commands, version-aware, argv lists only, always a timeout."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.logs import get_logger

from .backend import check_node_update, filter_jobs, node_names
from .errors import JobNotFound, SlurmCommandError, SlurmError, SlurmRequestError, SlurmTimeout
from .hostlist import compress_hostlist, expand_hostlist
from .parse import (
    parse_jobs_json,
    parse_nodes_json,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_version,
)
from .records import JobInfo, NodeInfo, SlurmVersion

__all__ = ["CliBackend", "CommandResult", "Runner", "run_command"]

log = get_logger(__name__)

# `scontrol --json` and `--json` with working filters arrived in 23.02; 22.05 has only `squeue --json`.
SCONTROL_JSON_SINCE = SlurmVersion(23, 2, 0)
_GONE = ("Invalid job id specified", "Invalid job id", "Unknown job")
# scancel on a job that already ended: the wanted outcome holds, so not an error here.
_ALREADY_DONE = ("already completing or completed",)
# slurmctld's "not now" to a job update (e.g. "Job update not available right now, the DB index is being
# set, try again in a bit"): the same request succeeds a moment later.
_TRY_AGAIN = ("try again",)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], Mapping[str, str], float], CommandResult]


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CommandResult:
    """Run one command: no shell, no stdin, bounded by `timeout` seconds."""
    try:
        done = subprocess.run(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SlurmTimeout(argv, None, stderr, why=f"timed out after {timeout:g} s") from exc
    except OSError as exc:
        raise SlurmCommandError(argv, None, "", why=f"could not start ({exc.strerror or exc})") from exc
    return CommandResult(done.returncode, done.stdout, done.stderr)


class CliBackend:
    """SlurmBackend over sbatch/scontrol/squeue/scancel. `env` is added to this process's environment
    (so SLURM_CONF passes through); `runner` replaces subprocess in unit tests."""

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        bin_dir: str | Path | None = None,
        runner: Runner | None = None,
        version: SlurmVersion | None = None,
        retry_delays: Sequence[float] = (1.0, 2.0),
    ) -> None:
        if timeout <= 0:
            raise SlurmRequestError(f"timeout must be positive, got {timeout}")
        self._timeout = timeout
        self._env = dict(env or {})
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._runner: Runner = runner or run_command
        self._version = version
        self._retry_delays = tuple(retry_delays)  # before each new try of a job command Slurm said to retry

    # -- plumbing ---------------------------------------------------------------------------------

    def _argv(self, tool: str, *args: str) -> list[str]:
        exe = str(self._bin_dir / tool) if self._bin_dir is not None else tool
        return [exe, *args]

    def _run(self, tool: str, *args: str, env: Mapping[str, str] | None = None, check: bool = True) -> CommandResult:
        argv = self._argv(tool, *args)
        full_env = {**os.environ, **self._env, **(env or {})}
        started = time.monotonic()
        result = self._runner(argv, full_env, self._timeout)
        log.debug("slurm.command", argv=argv, rc=result.returncode, seconds=time.monotonic() - started)
        if check and result.returncode != 0:
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return result

    def _json(self) -> bool:
        return self.version() >= SCONTROL_JSON_SINCE

    # -- reads ------------------------------------------------------------------------------------

    def version(self) -> SlurmVersion:
        if self._version is None:
            self._version = parse_version(self._run("scontrol", "--version").stdout)
        return self._version

    def job(self, job_id: str) -> JobInfo:
        job_id = str(job_id)
        if self._json():
            result = self._run("scontrol", "--json", "show", "job", job_id, check=False)
        else:
            result = self._run("scontrol", "show", "job", "-o", job_id, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            if any(marker in result.stderr + result.stdout for marker in _GONE):
                raise JobNotFound(job_id)
            argv = self._argv("scontrol", "show", "job", job_id)
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        try:
            found = parse_jobs_json(result.stdout) if self._json() else parse_scontrol_jobs(result.stdout)
        except SlurmError as exc:
            # scontrol --json may exit 0 and report the unknown id inside the document.
            if any(marker in str(exc) for marker in _GONE):
                raise JobNotFound(job_id) from exc
            raise
        # A heterogeneous job lists its components; an array id may list its tasks.
        for job in found:
            if job.job_id == job_id:
                return job
        if found:
            return found[0]
        raise JobNotFound(job_id)

    def jobs(
        self, *, user: str | None = None, name: str | None = None, states: Iterable[str] | None = None
    ) -> list[JobInfo]:
        args = ["--json", "--all", "--states=all"]
        # 22.05 ignores these with --json; later releases honour them; we filter again either way.
        if user is not None:
            args.append(f"--user={user}")
        if name is not None:
            args.append(f"--name={name}")
        found = parse_jobs_json(self._run("squeue", *args).stdout)
        return filter_jobs(found, user=user, name=name, states=states)

    def nodes(self, names: Iterable[str] | str | None = None) -> list[NodeInfo]:
        wanted = node_names(names) if names is not None else None
        target = [compress_hostlist(wanted)] if wanted else []
        if self._json():
            found = parse_nodes_json(self._run("scontrol", "--json", "show", "node", *target).stdout)
        else:
            found = parse_scontrol_nodes(self._run("scontrol", "show", "node", "-o", *target).stdout)
        if wanted is None:
            return found
        keep = set(wanted)
        return [n for n in found if n.name in keep]

    def hostnames(self, hostlist: str) -> list[str]:
        # Slurm's expansion rules are implemented purely in hostlist.py; no command needed.
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
    ) -> str:
        script = Path(script)
        if not script.is_file():
            raise SlurmRequestError(f"batch script {str(script)!r} does not exist")
        opts = ["--parsable", *(["--test-only"] if test_only else []), *args, str(script), *script_args]
        result = self._run("sbatch", *opts, env=env)
        if test_only:
            # The estimate is printed on stderr by sbatch's logger.
            return parse_sbatch_test_only(result.stderr + "\n" + result.stdout).job_id
        return parse_sbatch_parsable(result.stdout)

    def cancel(self, job_id: str, *, signal: str | int | None = None, batch_only: bool = False) -> None:
        opts: list[str] = []
        if signal is not None:
            opts.append(f"--signal={signal}")
        if batch_only:
            opts.append("--batch")
        self._checked_job_command("scancel", *opts, str(job_id), job_id=str(job_id))

    def requeue(self, job_id: str) -> None:
        self._checked_job_command("scontrol", "requeue", str(job_id), job_id=str(job_id))

    def resize_job(
        self, job_id: str, *, num_nodes: int | None = None, nodelist: Iterable[str] | str | None = None
    ) -> None:
        if num_nodes is None and nodelist is None:
            raise SlurmRequestError("resize_job needs num_nodes or nodelist")
        fields = [f"JobId={job_id}"]
        if num_nodes is not None:
            if num_nodes < 1:
                raise SlurmRequestError(f"num_nodes must be at least 1, got {num_nodes}")
            fields.append(f"NumNodes={num_nodes}")
        if nodelist is not None:
            names = node_names(nodelist)
            if not names:
                raise SlurmRequestError("resize_job nodelist is empty")
            fields.append(f"NodeList={compress_hostlist(names)}")
        self._checked_job_command("scontrol", "update", *fields, job_id=str(job_id))

    def set_comment(self, job_id: str, comment: str) -> None:
        if "\n" in comment or len(comment) > 4000:
            raise SlurmRequestError(f"a job comment must be one line of at most 4000 characters, got {comment[:80]!r}")
        self._checked_job_command("scontrol", "update", f"JobId={job_id}", f"Comment={comment}", job_id=str(job_id))

    def set_node_state(self, names: Iterable[str] | str, state: str, reason: str) -> None:
        hostlist, wanted = check_node_update(names, state, reason)
        fields = [f"NodeName={hostlist}", f"State={wanted}"]
        if reason.strip():
            fields.append(f"Reason={reason.strip()}")
        self._run("scontrol", "update", *fields)

    def _checked_job_command(self, tool: str, *args: str, job_id: str) -> None:
        result = self._run(tool, *args, check=False)
        for delay in self._retry_delays:
            if result.returncode == 0 or not any(marker in result.stderr for marker in _TRY_AGAIN):
                break
            time.sleep(delay)
            result = self._run(tool, *args, check=False)
        if result.returncode == 0 and "error" not in result.stderr.lower():
            return
        if any(marker in result.stderr for marker in _GONE):
            raise JobNotFound(job_id)
        if tool == "scancel" and any(marker in result.stderr for marker in _ALREADY_DONE):
            return
        raise SlurmCommandError(self._argv(tool, *args), result.returncode, result.stderr or result.stdout)
