"""Normalise job and node state strings of every Slurm output format into (state, base, flags).

The rules follow Slurm's own printers (`job_state_string`, `node_state_string` and
`node_state_string_complete` in src/common/slurm_protocol_defs.c).
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_elastic.errors import SlurmParseError

from .records import JOB_BASE_STATES, NODE_BASE_STATES

__all__ = ["job_state", "job_state_from_list", "node_state", "node_state_from_list"]

# job_state_string() prints the first of these flags that is set, else the base state.
JOB_FLAG_PRECEDENCE = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
_JOB_COMPACT = {
    "PD": "PENDING",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "CD": "COMPLETED",
    "CA": "CANCELLED",
    "F": "FAILED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "PR": "PREEMPTED",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "OOM": "OUT_OF_MEMORY",
    "CG": "COMPLETING",
    "SO": "STAGE_OUT",
    "CF": "CONFIGURING",
    "RS": "RESIZING",
    "RQ": "REQUEUED",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "SE": "SPECIAL_EXIT",
    "ST": "STOPPED",
    "RV": "REVOKED",
    "RD": "RESV_DEL_HOLD",
    "SI": "SIGNALING",
}
# sacct and old outputs spell these differently.
_JOB_ALIASES = {"COMPLETE": "COMPLETED", "CANCELED": "CANCELLED", "OOM": "OUT_OF_MEMORY"}
_KNOWN_JOB_WORDS = JOB_BASE_STATES | set(JOB_FLAG_PRECEDENCE)


def job_state(word: str) -> tuple[str, str | None, frozenset[str]]:
    """One state word (`RUNNING`, `COMPLETING`, `CANCELLED by 1000`, `R`) -> (state, base, flags)."""
    raw = word.strip()
    token = raw.split()[0].upper() if raw else ""
    token = _JOB_COMPACT.get(token, token)
    token = _JOB_ALIASES.get(token, token)
    if token not in _KNOWN_JOB_WORDS:
        raise SlurmParseError(f"unknown job state {word!r}; known: {', '.join(sorted(_KNOWN_JOB_WORDS))}")
    if token in JOB_BASE_STATES:
        return token, token, frozenset()
    return token, None, frozenset({token})


def job_state_from_list(items: Iterable[str]) -> tuple[str, str | None, frozenset[str]]:
    """A JSON state list (`["RUNNING", "COMPLETING"]`, data_parser v0.0.40+) -> (state, base, flags)."""
    words = [str(item).upper() for item in items]
    bases = [w for w in words if w in JOB_BASE_STATES]
    flags = frozenset(w for w in words if w not in JOB_BASE_STATES)
    base = bases[0] if bases else None
    shown = next((f for f in JOB_FLAG_PRECEDENCE if f in flags), base)
    if shown is None:
        raise SlurmParseError(f"job state list {words!r} names no known state")
    return shown, base, flags


# Node state suffixes printed by sinfo and by scontrol of older releases (node_state_string()).
_NODE_SUFFIX = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINT",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
    "+": "COMPLETING",
}
# Long and short words of sinfo's %T/%t that hide the base state behind a flag: best base guess + flags.
# "drained" may also be DOWN+DRAIN; sinfo cannot tell, scontrol and JSON can.
_NODE_WORDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "DRAINED": ("IDLE", ("DRAIN",)),
    "DRAIN": ("IDLE", ("DRAIN",)),
    "DRAINING": ("ALLOCATED", ("DRAIN",)),
    "DRNG": ("ALLOCATED", ("DRAIN",)),
    "FAIL": ("IDLE", ("FAIL",)),
    "FAILING": ("ALLOCATED", ("FAIL",)),
    "FAILG": ("ALLOCATED", ("FAIL",)),
    "MAINT": ("IDLE", ("MAINT",)),
    "REBOOT": ("IDLE", ("REBOOT_REQUESTED",)),
    "BOOT": ("IDLE", ("REBOOT_REQUESTED",)),
    "REBOOT_ISSUED": ("IDLE", ("REBOOT_ISSUED",)),
    "CANCEL_REBOOT": ("IDLE", ("REBOOT_CANCEL",)),
    "CANC_R": ("IDLE", ("REBOOT_CANCEL",)),
    "COMPLETING": ("IDLE", ("COMPLETING",)),
    "COMP": ("IDLE", ("COMPLETING",)),
    "INVAL": ("UNKNOWN", ("INVALID_REG",)),
    "PERFCTRS": ("IDLE", ("NET",)),
    "NPC": ("IDLE", ("NET",)),
    "RESERVED": ("IDLE", ("RESERVED",)),
    "RESV": ("IDLE", ("RESERVED",)),
    "PLANNED": ("IDLE", ("PLANNED",)),
    "PLND": ("IDLE", ("PLANNED",)),
    "POWER_DOWN": ("IDLE", ("POWER_DOWN",)),
    "POW_DN": ("IDLE", ("POWER_DOWN",)),
    "POWERED_DOWN": ("IDLE", ("POWERED_DOWN",)),
    "POWERED_DN": ("IDLE", ("POWERED_DOWN",)),
    "POWERING_DOWN": ("IDLE", ("POWERING_DOWN",)),
    "POWRING_DN": ("IDLE", ("POWERING_DOWN",)),
    "POWERING_UP": ("IDLE", ("POWERING_UP",)),
    "POWER_UP": ("IDLE", ("POWER_UP",)),
    "POW_UP": ("IDLE", ("POWER_UP",)),
    "CLOUD": ("IDLE", ("CLOUD",)),
    "RESUME": ("UNKNOWN", ("RESUME",)),
    "ALLOC": ("ALLOCATED", ()),
    "MIX": ("MIXED", ()),
    "FUTR": ("FUTURE", ()),
    "UNK": ("UNKNOWN", ()),
}


def _node_word(word: str) -> tuple[str, set[str]]:
    flags: set[str] = set()
    core = word.strip().upper()
    while core and core[-1] in _NODE_SUFFIX:
        flags.add(_NODE_SUFFIX[core[-1]])
        core = core[:-1]
    if core in NODE_BASE_STATES:
        return core, flags
    if core in _NODE_WORDS:
        base, extra = _NODE_WORDS[core]
        return base, flags | set(extra)
    raise SlurmParseError(f"unknown node state {word!r}")


def node_state(text: str) -> tuple[str, frozenset[str]]:
    """`IDLE+DRAIN`, `DOWN*`, `drained`, `mixed-`, `ALLOCATED+DRAIN+NOT_RESPONDING` -> (base, flags)."""
    parts = [p for p in text.strip().split("+") if p]
    if not parts:
        raise SlurmParseError(f"empty node state {text!r}")
    base, flags = _node_word(parts[0])
    # A trailing '+' (sinfo's `allocated+`) is the COMPLETING suffix, not a separator.
    if text.strip().endswith("+"):
        flags.add("COMPLETING")
    for part in parts[1:]:
        word = part.strip().upper()
        while word and word[-1] in _NODE_SUFFIX and word[-1] != "+":
            flags.add(_NODE_SUFFIX[word[-1]])
            word = word[:-1]
        if word:
            flags.add(word)
    return base, frozenset(flags)


def node_state_from_list(items: Iterable[str]) -> tuple[str, frozenset[str]]:
    """A JSON list (`["IDLE", "DRAIN"]`, data_parser v0.0.39+) -> (base, flags)."""
    words = [str(item).upper() for item in items]
    bases = [w for w in words if w in NODE_BASE_STATES]
    if not bases:
        if not words:
            raise SlurmParseError("empty node state list")
        base, flags = _node_word(words[0])
        return base, frozenset(flags | set(words[1:]))
    return bases[0], frozenset(w for w in words if w not in NODE_BASE_STATES)
