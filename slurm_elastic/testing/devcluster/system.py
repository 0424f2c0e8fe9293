"""What the local cluster needs from the machine: Debian packages, the munge key and a running munged."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from slurm_elastic.testing.devcluster import procs
from slurm_elastic.testing.devcluster.conf import SlurmVersion
from slurm_elastic.testing.devcluster.shell import ClusterError, find_binary, run, start_daemon, tail
from slurm_elastic.waiting import holds_within

__all__ = [
    "MUNGE_KEY",
    "PACKAGES",
    "ensure_munge",
    "ensure_packages",
    "missing_binaries",
    "slurm_version",
    "stop_munge",
]

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "iproute2")
# The binaries that the packages above provide and that the cluster uses.
_BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "sbatch", "srun", "scancel", "ip")
MUNGE_KEY = Path("/etc/munge/munge.key")
_MUNGE_RUN_DIR = Path("/run/munge")
_MUNGE_PID_FILE = _MUNGE_RUN_DIR / "munged.pid"
_MUNGE_LOG = Path("/var/log/munge/munged.log")
# Marks that `up` started munged, so that `down` stops it and nothing else.
_STARTED_MARKER = "munged.started.pid"


def missing_binaries() -> list[str]:
    return [name for name in _BINARIES if find_binary(name) is None]


def ensure_packages(log_dir: Path) -> None:
    """apt-get install the Slurm and munge packages when one of their binaries is missing (as root)."""
    missing = missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(
            f"{', '.join(missing)} not installed and not root: run as root or `apt-get install {' '.join(PACKAGES)}`"
        )
    apt_log = log_dir / "apt.log"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv, timeout_s in (
        (["apt-get", "update", "-q"], 600.0),
        (["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], 1200.0),
    ):
        result = run(argv, timeout_s=timeout_s, env=env, check=False, log=apt_log)
        with apt_log.open("a") as sink:
            sink.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(argv)!r} exited with {result.returncode}; see {apt_log}", tail(apt_log))
    still = missing_binaries()
    if still:
        raise ClusterError(f"{', '.join(still)} still missing after apt-get install; see {apt_log}")


def slurm_version() -> SlurmVersion:
    """The installed Slurm's version; `slurmctld -V` needs no slurm.conf (sinfo --version does)."""
    slurmctld = find_binary("slurmctld") or "slurmctld"
    result = run([slurmctld, "-V"], timeout_s=15.0)
    return SlurmVersion.parse(result.stdout or result.stderr)


def _munge_works() -> bool:
    munge = find_binary("munge")
    if munge is None:
        return False
    return run([munge, "-n"], timeout_s=10.0, check=False).returncode == 0


def _ensure_key(user: pwd.struct_passwd) -> None:
    if MUNGE_KEY.exists():
        return
    MUNGE_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(MUNGE_KEY.parent, user.pw_uid, user.pw_gid)
    # munged accepts any key of 32 bytes or more; 1024 random bytes is what mungekey writes.
    fd = os.open(MUNGE_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as key:
        key.write(os.urandom(1024))
    os.chown(MUNGE_KEY, user.pw_uid, user.pw_gid)


def ensure_munge(state_dir: Path, *, timeout_s: float = 15.0) -> bool:
    """Make munged answer; start it as the munge user if needed. True when this call started it."""
    if _munge_works():
        return False
    if os.geteuid() != 0:
        raise ClusterError("munged is not running and starting it needs root; run as root")
    try:
        user = pwd.getpwnam("munge")
    except KeyError as exc:
        raise ClusterError("user 'munge' does not exist: is the munge package installed?") from exc
    _ensure_key(user)
    # Without systemd nothing creates munged's runtime directory.
    _MUNGE_RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chown(_MUNGE_RUN_DIR, user.pw_uid, user.pw_gid)
    munged = find_binary("munged") or "munged"
    start_daemon([munged], out=state_dir / "log" / "munged.out", user="munge", log=_MUNGE_LOG)
    if not holds_within(_munge_works, timeout=timeout_s, poll=0.2):
        raise ClusterError(f"munged did not answer within {timeout_s:g} s; see {_MUNGE_LOG}", tail(_MUNGE_LOG))
    pid = procs.read_pid_file(_MUNGE_PID_FILE)
    if pid is not None:
        (state_dir / _STARTED_MARKER).write_text(f"{pid}\n")
    return True


def stop_munge(state_dir: Path) -> bool:
    """Stop munged if `ensure_munge` started it (for this state dir). True when it stopped one."""
    marker = state_dir / _STARTED_MARKER
    pid = procs.read_pid_file(marker)
    if pid is None:
        return False
    stopped = False
    live = {p.pid: p for p in procs.list_procs()}
    if pid in live and live[pid].name == "munged" and procs.alive(pid):
        left = procs.terminate([pid])
        if left:
            raise ClusterError(f"munged (pid {pid}) survived SIGKILL; see {_MUNGE_LOG}")
        stopped = True
    marker.unlink(missing_ok=True)
    return stopped
