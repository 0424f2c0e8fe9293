"""What a hook may believe of its environment: pure parsing and validation, nothing else.

Slurm runs the hooks as root. Job ids, uids and node names come from slurmd or slurmctld, but the job
comment, and the path inside it, are written by the job's user: every value is checked against a strict
shape before it is used, and a bad one raises `HookInputError` quoting it (with `!r`, so a newline or an
escape sequence can never forge a second log line). Nothing here touches the file system.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from slurm_elastic.errors import ElasticError, SlurmParseError
from slurm_elastic.slurm.hostlist import expand_hostlist

__all__ = [
    "COMMENT_PREFIX",
    "HANDLE_NAME",
    "HookInputError",
    "JobEnv",
    "handle_path_from_comment",
    "job_env",
    "parse_job_id",
    "parse_node_name",
    "parse_nodelist",
    "parse_uid",
    "this_node",
]

# The launcher sets every elastic job's comment to this prefix and the core job's coordinator.json.
COMMENT_PREFIX = "slurm-elastic:"
HANDLE_NAME = "coordinator.json"
MAX_PATH = 4096
MAX_NODELIST = 65536

_JOB_ID = re.compile(r"[0-9]{1,10}")
_UID = re.compile(r"[0-9]{1,10}")
# Slurm node names: letters, digits, '-', '_', '.'; no brackets (those belong to hostlists).
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class HookInputError(ElasticError):
    """A value from Slurm's environment (or from the job's comment) has the wrong shape."""


def parse_job_id(value: str | None, name: str = "SLURM_JOB_ID") -> str:
    if value is None or not _JOB_ID.fullmatch(value):
        raise HookInputError(f"{name}={value!r} is not a job id (1 to 10 digits)")
    return value


def parse_uid(value: str | None, name: str = "SLURM_JOB_UID") -> int:
    if value is None or not _UID.fullmatch(value) or int(value) >= 2**32 - 1:
        raise HookInputError(f"{name}={value!r} is not a uid (0 to 4294967294)")
    return int(value)


def parse_node_name(value: str | None, name: str = "SLURMD_NODENAME") -> str:
    if value is None or not _NODE.fullmatch(value):
        raise HookInputError(f"{name}={value!r} is not a node name (letters, digits, '-', '_', '.')")
    return value


def parse_nodelist(value: str | None, name: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """A hostlist expression (`n[1-3],gpu07`) -> validated node names; empty or missing -> ()."""
    if not value:
        return ()
    if len(value) > MAX_NODELIST or _CONTROL.search(value):
        raise HookInputError(f"{name}={value[:80]!r} is not a hostlist (too long, or control characters)")
    try:
        names = expand_hostlist(value)
    except SlurmParseError as exc:
        raise HookInputError(f"{name}={value[:80]!r} is not a hostlist: {exc}") from None
    return tuple(parse_node_name(n, f"a node of {name}") for n in names)


def handle_path_from_comment(comment: str | None) -> PurePosixPath | None:
    """`slurm-elastic:/abs/path/coordinator.json` -> that path; any other comment -> None (not elastic).

    The path must be absolute, already normalised (no `.`, `..`, `//` or trailing `/`), name the handle
    file, and hold no control character. Spaces, quotes, `$()` and backticks are ordinary characters here:
    the path is only ever given to open(2), never to a shell.
    """
    if comment is None:
        return None
    text = comment.strip()
    if not text.startswith(COMMENT_PREFIX):
        return None
    raw = text[len(COMMENT_PREFIX) :]
    if not raw:
        raise HookInputError(f"job comment {comment[:200]!r} names no path after {COMMENT_PREFIX!r}")
    if len(raw) > MAX_PATH:
        raise HookInputError(f"the path in the job comment is {len(raw)} characters long; the limit is {MAX_PATH}")
    if _CONTROL.search(raw):
        raise HookInputError(f"the path in the job comment holds a control character: {raw[:200]!r}")
    if not raw.startswith("/"):
        raise HookInputError(f"the path in the job comment must be absolute, got {raw[:200]!r}")
    if os.path.normpath(raw) != raw or "//" in raw:
        raise HookInputError(f"the path in the job comment is not normalised: {raw[:200]!r}")
    path = PurePosixPath(raw)
    if path.name != HANDLE_NAME:
        raise HookInputError(f"the path in the job comment must name {HANDLE_NAME}, got {raw[:200]!r}")
    return path


@dataclass(frozen=True)
class JobEnv:
    """The job a Prolog, Epilog or EpilogSlurmctld runs for, as Slurm describes it."""

    job_id: str
    uid: int
    node: str | None  # None on the controller (PrologSlurmctld, EpilogSlurmctld)
    nodes: tuple[str, ...]  # the nodes this run is about (Epilog: the nodes being released)
    comment: str | None  # raw, unvalidated: see handle_path_from_comment
    context: str  # SLURM_SCRIPT_CONTEXT: prolog_slurmd, epilog_slurmd, epilog_slurmctld...


def job_env(environ: Mapping[str, str], *, on_node: bool) -> JobEnv:
    """Read the job a hook runs for. `on_node`: a slurmd hook, which must know its node's name.

    The node list is SLURM_NODELIST in slurmd's hooks (on a shrink: only the nodes being released) and
    SLURM_JOB_NODELIST in slurmctld's; SLURM_JOB_COMMENT is present on 22.05 and later.
    """
    job_id = parse_job_id(environ.get("SLURM_JOB_ID"))
    uid = parse_uid(environ.get("SLURM_JOB_UID"))
    node = parse_node_name(environ.get("SLURMD_NODENAME")) if on_node else None
    key = "SLURM_NODELIST" if "SLURM_NODELIST" in environ else "SLURM_JOB_NODELIST"
    nodes = parse_nodelist(environ.get(key), key)
    context = environ.get("SLURM_SCRIPT_CONTEXT", "")
    if _CONTROL.search(context) or len(context) > 64:
        context = "?"
    return JobEnv(job_id, uid, node, nodes, environ.get("SLURM_JOB_COMMENT"), context)


def this_node(environ: Mapping[str, str]) -> str:
    """The node a HealthCheckProgram runs on: SLURMD_NODENAME (22.05 sets only that), else the short hostname."""
    value = environ.get("SLURMD_NODENAME")
    if value is not None:
        return parse_node_name(value)
    return parse_node_name(socket.gethostname().split(".", 1)[0], "hostname")
