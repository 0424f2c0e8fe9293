"""Pure parsers of Slurm's text outputs: `scontrol show job|node`, `sinfo -o`, `sbatch`, `--version`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.errors import SlurmParseError

from .hostlist import expand_hostlist
from .records import JobInfo, NodeInfo, SlurmVersion
from .states import job_state, node_state

__all__ = [
    "TestOnlyResult",
    "job_from_fields",
    "node_from_fields",
    "parse_duration_minutes",
    "parse_key_values",
    "parse_sbatch_parsable",
    "parse_sbatch_test_only",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_nodes",
    "parse_version",
]

# Values of these keys are free text and may contain spaces and even `word=word`; inside them, only
# a key that scontrol really prints starts a new field.
_FREE_TEXT = frozenset(
    {"JobName", "Reason", "Comment", "AdminComment", "SystemComment", "Command", "WorkDir", "StdErr"}
    | {"StdIn", "StdOut", "OS", "Extra", "Features", "AvailableFeatures", "ActiveFeatures", "Dependency"}
)
# Keys scontrol prints for jobs (20.11 .. 24.11), then for nodes.
_JOB_KEYS = """
    JobId JobName UserId GroupId MCS_label Priority Nice Account QOS JobState Reason Dependency Requeue
    Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime
    AccrueTime StartTime EndTime Deadline PreemptEligibleTime PreemptTime SuspendTime SecsPreSuspend
    LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList ExcNodeList NodeList SchedNodeList
    BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES AllocTRES ReqTRES Socks/Node
    NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode Features DelayBoot
    OverSubscribe Contiguous Licenses Network Command WorkDir StdErr StdIn StdOut Power Comment
    AdminComment SystemComment ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset
    HetJobIdSet HetComponent ResizeTime Reservation Gres TresPerNode TresPerJob TresPerTask MailUser
    MailType CpusPerTres MemPerTres TresBind TresFreq Prefer ClusterFeatures Container ContainerID
    NtasksPerTRES FailedNode KillOInInvalidDependent LicensesAlloc Nodes CPU_IDs Mem GRES GRES_IDX
"""
_NODE_KEYS = """
    NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures
    NodeAddr NodeHostName Port Version OS RealMemory AllocMem FreeMem Sockets Boards State
    ThreadsPerCore TmpDisk Weight Owner Partitions BootTime SlurmdStartTime LastBusyTime ResumeAfterTime
    CfgTRES CapWatts CurrentWatts AveWatts ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp GresDrain
    GresUsed InstanceId InstanceType Extra NextState CoreSpecCount CPUSpecList MemSpecLimit
    TopologyParam ReservationName
"""
_KNOWN_KEYS = frozenset(_JOB_KEYS.split()) | frozenset(_NODE_KEYS.split())
_KEY_AT = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=")
_NULLS = frozenset({"(null)", ""})
_REASON_STAMP = re.compile(r"\s*\[[^\]\s@]+@[^\]\s]+\]$")


def parse_key_values(text: str) -> dict[str, str]:
    """`Key=value Key2=a value with spaces ...` (one record, one or many lines) -> dict, first key wins."""
    flat = " ".join(line.strip() for line in text.splitlines())
    marks: list[tuple[str, int, int]] = []  # (key, key start, value start)
    for m in _KEY_AT.finditer(flat):
        key = m.group(1)
        if marks and marks[-1][0] in _FREE_TEXT and key not in _KNOWN_KEYS:
            continue
        marks.append((key, m.start(), m.end()))
    if not marks or marks[0][1] != 0:
        raise SlurmParseError(f"expected `Key=value` fields, got {flat[:80]!r}")
    fields: dict[str, str] = {}
    for i, (key, _start, value_at) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else len(flat)
        fields.setdefault(key, flat[value_at:end].strip())
    return fields


def _records(text: str, first_key: str) -> list[str]:
    """Split `scontrol show` output (one line per record with -o, or indented blocks) into records."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith(first_key + "=") or not records:
            records.append([line])
        else:
            records[-1].append(line)
    return ["\n".join(r) for r in records]


def _none_if_null(value: str | None) -> str | None:
    if value is None or value in _NULLS:
        return None
    return value


def _reason(value: str | None) -> str:
    """Slurm prints `Reason=None` when there is none."""
    value = _none_if_null(value)
    return "" if value is None or value == "None" else value


def _int(fields: dict[str, str], key: str, default: int = 0) -> int:
    raw = fields.get(key, "")
    m = re.match(r"\d+", raw)
    return int(m.group(0)) if m else default


def _time(value: str | None) -> datetime | None:
    """Slurm prints local times without a zone; read them as this process's local time."""
    if not value or value in {"Unknown", "None", "N/A", "(null)"}:
        return None
    try:
        return datetime.fromisoformat(value).astimezone()
    except ValueError:
        return None


def parse_duration_minutes(text: str) -> int | None:
    """`UNLIMITED` -> None; `1-02:03:04`, `02:03:04`, `03:04` (min:sec), `5` (minutes) -> minutes (ceil)."""
    value = text.strip()
    if value.upper() in {"UNLIMITED", "INFINITE", "PARTITION_LIMIT", "N/A", "NONE", ""}:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if m is None:
        raise SlurmParseError(f"cannot read a time limit from {text!r}")
    days = int(m.group(1) or 0)
    parts = [int(p) for p in m.group(2, 3, 4) if p is not None]
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2 and m.group(1) is not None:
        hours, minutes, seconds = parts[0], parts[1], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = (parts[0], 0, 0) if m.group(1) is not None else (0, parts[0], 0)
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total // 60)


def job_from_fields(fields: dict[str, str]) -> JobInfo:
    """A `scontrol show job` record's fields -> JobInfo."""
    if "JobId" not in fields:
        raise SlurmParseError(f"job record without JobId: {sorted(fields)[:8]}")
    state, base, flags = job_state(fields.get("JobState", ""))
    user = fields.get("UserId", "")
    nodelist = _none_if_null(fields.get("NodeList"))
    limit = fields.get("TimeLimit")
    het = _none_if_null(fields.get("HetJobId"))
    return JobInfo(
        job_id=fields["JobId"],
        name=_none_if_null(fields.get("JobName")) or "",
        user=user.split("(", 1)[0],
        state=state,
        base_state=base,
        flags=flags,
        partition=_none_if_null(fields.get("Partition")) or "",
        nodes=tuple(expand_hostlist(nodelist)) if nodelist else (),
        num_nodes=_int(fields, "NumNodes"),
        batch_host=_none_if_null(fields.get("BatchHost")),
        restart_count=_int(fields, "Restarts"),
        work_dir=_none_if_null(fields.get("WorkDir")) or "",
        comment=_none_if_null(fields.get("Comment")) or "",
        reason=_reason(fields.get("Reason")),
        time_limit_minutes=parse_duration_minutes(limit) if limit else None,
        submit_time=_time(fields.get("SubmitTime")),
        start_time=_time(fields.get("StartTime")),
        array_job_id=_none_if_null(fields.get("ArrayJobId")),
        array_task_id=_none_if_null(fields.get("ArrayTaskId")),
        het_job_id=het,
        het_job_offset=_int(fields, "HetJobOffset") if het else None,
    )


def parse_scontrol_jobs(text: str) -> list[JobInfo]:
    """`scontrol show job [-o] [-d] [id]` -> jobs (a heterogeneous job gives one record per component)."""
    if not text.strip() or text.strip().startswith("No jobs in the system"):
        return []
    return [job_from_fields(parse_key_values(r)) for r in _records(text, "JobId")]


def node_from_fields(fields: dict[str, str]) -> NodeInfo:
    """A `scontrol show node` record's fields -> NodeInfo."""
    if "NodeName" not in fields:
        raise SlurmParseError(f"node record without NodeName: {sorted(fields)[:8]}")
    base, flags = node_state(fields.get("State", "UNKNOWN"))
    partitions = _none_if_null(fields.get("Partitions"))
    return NodeInfo(
        name=fields["NodeName"],
        state=base,
        flags=flags,
        # scontrol appends who set the reason and when: `Reason=maintenance [root@2024-05-02T10:05:00]`.
        reason=_REASON_STAMP.sub("", _reason(fields.get("Reason"))),
        partitions=tuple(p for p in (partitions or "").split(",") if p),
    )


def parse_scontrol_nodes(text: str) -> list[NodeInfo]:
    """`scontrol show node [-o] [names]` -> nodes."""
    if not text.strip():
        return []
    return [node_from_fields(parse_key_values(r)) for r in _records(text, "NodeName")]


def parse_sinfo_nodes(text: str, fields: str = "NTE", sep: str = "|") -> list[NodeInfo]:
    """`sinfo -N -h -o '%N|%T|%E'` (field letters in `fields`; E, the reason, must come last).

    sinfo prints a node once per partition: the records are merged, partitions (%P) gathered.
    """
    if "N" not in fields or "T" not in fields or ("E" in fields and not fields.endswith("E")):
        raise SlurmParseError(f"sinfo fields {fields!r} must include N and T, with E last if present")
    merged: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split(sep, len(fields) - 1)
        if len(cols) != len(fields):
            raise SlurmParseError(f"sinfo line {line!r} has {len(cols)} fields, expected {len(fields)}")
        row = dict(zip(fields, (c.strip() for c in cols), strict=True))
        base, flags = node_state(row["T"])
        reason = row.get("E", "")
        reason = "" if reason.lower() in {"none", "(null)"} else reason
        part = row.get("P", "").rstrip("*")
        for name in expand_hostlist(row["N"]):
            old = merged.get(name)
            parts = (old.partitions if old else ()) + ((part,) if part else ())
            merged[name] = NodeInfo(name, base, flags, reason or (old.reason if old else ""), parts)
    return list(merged.values())


def parse_sbatch_parsable(text: str) -> str:
    """`sbatch --parsable` stdout (`123` or `123;cluster`) -> job id."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    m = re.fullmatch(r"(\d+)(?:;(\S+))?", lines[-1]) if lines else None
    if m is None:
        raise SlurmParseError(f"sbatch --parsable printed {text.strip()[:120]!r}, expected `<id>[;cluster]`")
    return m.group(1)


@dataclass(frozen=True)
class TestOnlyResult:
    """What `sbatch --test-only` says a job would get."""

    job_id: str
    start_time: str
    processors: int
    nodes: tuple[str, ...]
    partition: str


_TEST_ONLY = re.compile(r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S*)(?: in partition (\S+))?")


def parse_sbatch_test_only(text: str) -> TestOnlyResult:
    """`sbatch: Job 5 to start at <time> using 4 processors on nodes n[1-4] in partition train`."""
    m = _TEST_ONLY.search(text)
    if m is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise SlurmParseError(f"sbatch --test-only gave no start estimate: {first!r}")
    return TestOnlyResult(
        job_id=m.group(1),
        start_time=m.group(2),
        processors=int(m.group(3)),
        nodes=tuple(expand_hostlist(m.group(4))),
        partition=m.group(5) or "",
    )


def parse_version(text: str) -> SlurmVersion:
    """`slurm 22.05.8` / `slurm-wlm 24.11.1` (from `scontrol --version`, `sinfo --version`)."""
    return SlurmVersion.parse(text)
