"""Node health, as the Prolog and the HealthCheckProgram see it.

Checks: GPUs visible and healthy (where nvidia-smi exists), free space in /dev/shm and in slurmd's spool,
the data cache directory writable (and root's: a user's plant there is reported, never acted on). A fatal
problem (a GPU missing or broken) makes the node FAIL, a degraded one (little space, a GPU with uncorrected
ECC errors, the cache not writable) DRAINs it.
Pure verdicts on measured facts, with the few measurements beside them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.hooks.safedir import UnsafePath, open_root_dir
from slurm_elastic.hooks.settings import HookSettings, expand_node_path

__all__ = [
    "GPU_QUERY",
    "Problem",
    "cache_problem",
    "free_mb",
    "gpu_problems",
    "reason_for",
    "run_checks",
    "space_problem",
    "target_state",
]

Severity = Literal["fatal", "degraded"]
GPU_QUERY = ("--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits")
GPU_TIMEOUT_S = 10.0
MAX_REASON = 250


@dataclass(frozen=True)
class Problem:
    check: str
    severity: Severity
    detail: str


def free_mb(path: str) -> int | None:
    """Free megabytes for an unprivileged user at `path`; None when it does not exist."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize // (1024 * 1024)


def space_problem(check: str, path: str, free: int | None, minimum_mb: int) -> Problem | None:
    if free is None:
        return Problem(check, "degraded", f"{path} is missing")
    if free < minimum_mb:
        return Problem(check, "degraded", f"{free} MB free in {path}, need {minimum_mb}")
    return None


def cache_problem(path: str, notices: list[str] | None = None) -> Problem | None:
    """The data cache directory exists (root's, sticky and world-writable like /tmp) and takes a file.

    It is created, its mode set and a probe file written through descriptors reached from / (see
    hooks.safedir): a link or a directory another user planted on the way is never followed, changed or
    written to. Nor does it drain the node: it is reported in `notices` (the hook logs it), and the
    jobs' workers read their data from its origin instead.
    """
    try:
        fd = open_root_dir(path, create_mode=0o1777)  # every job's user creates its own <job id> directory here
    except UnsafePath as exc:
        if notices is not None:
            notices.append(f"data cache {path} not used: {exc}")
        return None
    except OSError as exc:
        return Problem("cache", "degraded", f"data cache {path} is not writable: {exc.strerror}")
    try:
        probe = f".health-{secrets.token_hex(8)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd))
        os.unlink(probe, dir_fd=fd)
    except OSError as exc:
        return Problem("cache", "degraded", f"data cache {path} is not writable: {exc.strerror}")
    finally:
        os.close(fd)
    return None


def gpu_problems(returncode: int | None, stdout: str, stderr: str, expected: int) -> list[Problem]:
    """Judge `nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total` output.

    `returncode` None: it timed out, which a wedged GPU does. `expected` 0: any number of GPUs, at least one.
    """
    if returncode is None:
        return [Problem("gpu", "fatal", f"nvidia-smi did not answer within {GPU_TIMEOUT_S:g} s")]
    if returncode != 0:
        first = next((line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()), "")
        return [Problem("gpu", "fatal", f"nvidia-smi failed (exit {returncode}): {first[:120]}")]
    rows = [[c.strip() for c in line.split(",")] for line in stdout.splitlines() if line.strip()]
    problems = []
    want = max(expected, 1)
    if len(rows) < want:
        problems.append(Problem("gpu", "fatal", f"{len(rows)} GPUs visible, expected {want}"))
    for row in rows:
        index = row[0] if row else "?"
        text = ",".join(row)
        if len(row) < 3 or "Unknown Error" in text or "requires reset" in text.lower():
            problems.append(Problem("gpu", "fatal", f"GPU {index}: {text[:80]}"))
        elif row[2].isdigit() and int(row[2]) > 0:
            problems.append(Problem("gpu", "degraded", f"GPU {index}: {row[2]} uncorrected ECC errors"))
    return problems


def _gpu_check(settings: HookSettings) -> list[Problem]:
    if settings.check_gpus == "no":
        return []
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return [Problem("gpu", "fatal", "nvidia-smi not found")] if settings.check_gpus == "yes" else []
    try:
        done = subprocess.run(
            [binary, *GPU_QUERY], capture_output=True, text=True, timeout=GPU_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return gpu_problems(None, "", "", settings.expected_gpus)
    except OSError as exc:
        return [Problem("gpu", "fatal", f"cannot run nvidia-smi: {exc.strerror}")]
    return gpu_problems(done.returncode, done.stdout, done.stderr, settings.expected_gpus)


def run_checks(
    settings: HookSettings, node: str, spool_dir: str | None, notices: list[str] | None = None
) -> list[Problem]:
    """Every check, in a fixed order. `spool_dir` None: not known here, not checked. What must be
    reported but must not drain the node (a user's plant in the cache path) goes to `notices`."""
    problems = _gpu_check(settings)
    checks: Sequence[tuple[str, str | None, int]] = (
        ("shm", "/dev/shm", settings.min_free_shm_mb),
        ("spool", spool_dir, settings.min_free_spool_mb),
    )
    for name, path, minimum in checks:
        if path is not None and minimum > 0:
            found = space_problem(name, path, free_mb(path), minimum)
            if found is not None:
                problems.append(found)
    cache = cache_problem(expand_node_path(settings.cache_dir, node), notices)
    if cache is not None:
        problems.append(cache)
    return problems


def target_state(problems: Sequence[Problem]) -> Literal["FAIL", "DRAIN"] | None:
    if not problems:
        return None
    return "FAIL" if any(p.severity == "fatal" for p in problems) else "DRAIN"


def reason_for(hook: str, problems: Sequence[Problem]) -> str:
    """A Slurm node Reason: `slurm-elastic <hook>: shm: 12 MB free in /dev/shm, need 256; ...`."""
    text = f"slurm-elastic {hook}: " + "; ".join(f"{p.check}: {p.detail}" for p in problems)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
