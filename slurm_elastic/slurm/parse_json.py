"""Pure parsers of Slurm's `--json` outputs, across data_parser/openapi versions.

- 21.08/22.05 (openapi v0.0.37/v0.0.38): `job_state` is a string, numbers are plain, node `state` is
  a lower-case word plus `state_flags`.
- 23.02 (v0.0.39): numbers may be `{"set": .., "infinite": .., "number": ..}`; node `state` a list.
- 23.11+ (v0.0.40 .. v0.0.42 in 24.x): `job_state` is a list too; times are such number objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from slurm_elastic.errors import SlurmError, SlurmParseError

from .hostlist import expand_hostlist
from .records import JobInfo, NodeInfo, SlurmVersion
from .states import job_state, job_state_from_list, node_state, node_state_from_list

__all__ = [
    "json_version",
    "parse_jobs_json",
    "parse_nodes_json",
    "parse_sinfo_json",
]


_UINT32_NO_VAL = 0xFFFFFFFE  # NO_VAL; INFINITE is 0xFFFFFFFF


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what}: not JSON ({exc.msg} at line {exc.lineno}): {text[:60]!r}") from exc
    if not isinstance(doc, dict):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0] if isinstance(errors[0], Mapping) else {"error": str(errors[0])}
        msg = first.get("description") or first.get("error") or str(first)
        raise SlurmError(f"{what}: Slurm reported an error: {msg}")
    return doc


def _number(value: Any) -> float | None:
    """A plain number, or v0.0.39+'s `{"set", "infinite", "number"}`: None when unset or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    raise SlurmParseError(f"expected a number, got {value!r}")


def _int(value: Any, default: int | None = None) -> int | None:
    number = _number(value)
    return default if number is None else int(number)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def _minutes(value: Any) -> int | None:
    """A time limit in minutes; None for unlimited (v0.0.37/38 print INFINITE/NO_VAL as uint32)."""
    minutes = _int(value)
    return None if minutes is None or minutes >= _UINT32_NO_VAL else minutes


def _epoch(value: Any) -> datetime | None:
    seconds = _int(value)
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def _nonzero_id(value: Any) -> str | None:
    number = _int(value)
    return str(number) if number else None


def _job(raw: Mapping[str, Any]) -> JobInfo:
    if "job_id" not in raw:
        raise SlurmParseError(f"job record without job_id: {sorted(raw)[:8]}")
    state_raw = raw.get("job_state", "")
    if isinstance(state_raw, list):
        state, base, flags = job_state_from_list(state_raw)
    else:
        state, base, flags = job_state(_text(state_raw))
    nodes = _text(raw.get("nodes"))
    het_id = _nonzero_id(raw.get("het_job_id"))
    reason = _text(raw.get("state_reason"))
    array_id = _nonzero_id(raw.get("array_job_id"))
    task = _int(raw.get("array_task_id"))
    return JobInfo(
        job_id=str(_int(raw["job_id"])),
        name=_text(raw.get("name")),
        user=_text(raw.get("user_name")) or _text(raw.get("user_id")),
        state=state,
        base_state=base,
        flags=flags,
        partition=_text(raw.get("partition")),
        nodes=tuple(expand_hostlist(nodes)) if nodes else (),
        num_nodes=_int(raw.get("node_count"), 0) or 0,
        batch_host=_text(raw.get("batch_host")) or None,
        restart_count=_int(raw.get("restart_cnt"), 0) or 0,
        work_dir=_text(raw.get("current_working_directory")),
        comment=_text(raw.get("comment")),
        reason="" if reason == "None" else reason,
        time_limit_minutes=_minutes(raw.get("time_limit")),
        submit_time=_epoch(raw.get("submit_time")),
        start_time=_epoch(raw.get("start_time")),
        array_job_id=array_id,
        array_task_id=str(task) if array_id is not None and task is not None else None,
        het_job_id=het_id,
        het_job_offset=_int(raw.get("het_job_offset")) if het_id else None,
    )


def parse_jobs_json(text: str) -> list[JobInfo]:
    """`squeue --json` (22.05+) or `scontrol --json show job [id]` (23.02+) -> jobs, unfiltered."""
    doc = _load(text, "jobs JSON")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError(f"jobs JSON has no `jobs` list (keys: {sorted(doc)[:8]})")
    return [_job(j) for j in jobs]


def _node(raw: Mapping[str, Any]) -> NodeInfo:
    name = _text(raw.get("name"))
    if not name:
        raise SlurmParseError(f"node record without name: {sorted(raw)[:8]}")
    state_raw = raw.get("state", "UNKNOWN")
    if isinstance(state_raw, list):
        base, flags = node_state_from_list(state_raw)
    else:
        # v0.0.37/38: a lower-case base word plus a separate list of flags.
        base, flags = node_state(_text(state_raw))
        flags = flags | {str(f).upper() for f in raw.get("state_flags") or []}
    partitions = raw.get("partitions") or []
    return NodeInfo(
        name=name,
        state=base,
        flags=frozenset(flags),
        reason=_text(raw.get("reason")),
        partitions=tuple(str(p) for p in partitions),
    )


def parse_nodes_json(text: str) -> list[NodeInfo]:
    """`scontrol --json show node` (23.02+) -> nodes."""
    doc = _load(text, "nodes JSON")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmParseError(f"nodes JSON has no `nodes` list (keys: {sorted(doc)[:8]})")
    return [_node(n) for n in nodes]


def parse_sinfo_json(text: str) -> list[NodeInfo]:
    """`sinfo --json` / `sinfo -N --json` (23.02+) -> nodes, one per name, partitions merged."""
    doc = _load(text, "sinfo JSON")
    rows = doc.get("sinfo")
    if not isinstance(rows, list):
        raise SlurmParseError(f"sinfo JSON has no `sinfo` list (keys: {sorted(doc)[:8]})")
    merged: dict[str, NodeInfo] = {}
    for row in rows:
        base, flags = node_state_from_list((row.get("node") or {}).get("state") or ["UNKNOWN"])
        reason = _text((row.get("reason") or {}).get("description"))
        part = _text((row.get("partition") or {}).get("name"))
        for expr in (row.get("nodes") or {}).get("nodes") or []:
            for name in expand_hostlist(str(expr)):
                old = merged.get(name)
                parts = (old.partitions if old else ()) + ((part,) if part else ())
                merged[name] = NodeInfo(name, base, flags, reason or (old.reason if old else ""), parts)
    return list(merged.values())


def json_version(text: str) -> SlurmVersion | None:
    """The Slurm version in a JSON output's `meta` (`Slurm` in 22.05, `slurm` later), if present."""
    doc = _load(text, "JSON")
    meta = doc.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    version = slurm.get("version") or {}
    try:
        return SlurmVersion(int(version["major"]), int(version["minor"]), int(version.get("micro", 0)))
    except (KeyError, TypeError, ValueError):
        release = slurm.get("release")
        return SlurmVersion.parse(release) if isinstance(release, str) else None
