"""Run external commands with a timeout, turning every failure into one SlurmError line."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_elastic.errors import SlurmError

__all__ = ["ClusterError", "find_binary", "run", "start_daemon", "tail"]

# sbin directories are not on every PATH (a non-root shell), yet the daemons live there.
_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


class ClusterError(SlurmError):
    """The local cluster failed; `detail` holds extra lines (a log tail) for a human to read."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in _SBIN_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    return None


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = 30.0,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv without a shell, stdin closed; raise ClusterError on a timeout or (with check) failure.

    `log` names the file a reader should open when it fails.
    """
    hint = f"; see {log}" if log else ""
    try:
        result = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ClusterError(f"{argv[0]} is not installed{hint}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{' '.join(argv)!r} did not finish within {timeout_s:g} s{hint}") from exc
    if check and result.returncode != 0:
        output = (result.stderr or result.stdout).strip().splitlines()
        last = output[-1] if output else "no output"
        raise ClusterError(
            f"{' '.join(argv)!r} exited with {result.returncode}: {last}{hint}",
            detail=(result.stdout + result.stderr).strip(),
        )
    return result


def start_daemon(
    argv: Sequence[str],
    *,
    out: Path,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    timeout_s: float = 30.0,
    log: Path | None = None,
) -> None:
    """Start a program that daemonizes itself; wait for the foreground parent to exit.

    Output goes to a file, not a pipe: a daemon that keeps its stdout would block a pipe reader forever.
    """
    hint = log or out
    with out.open("ab") as sink:
        try:
            result = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                env=dict(env) if env is not None else None,
                user=user,
                group=user,
                extra_groups=[] if user else None,
                check=False,
            )
        except FileNotFoundError as exc:
            raise ClusterError(f"{argv[0]} is not installed") from exc
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{' '.join(argv)!r} did not start within {timeout_s:g} s; see {hint}") from exc
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)!r} exited with {result.returncode}; see {hint}", detail=tail(hint))
