"""`slurm-elastic hooks check`: is an installation complete, safe to run as root, and enabled?

Each finding is one line (`ok` / `FAIL` / `warn`); any FAIL makes the command exit 1. The slurm.conf
checks are pure functions of the file's text. Run as root, it also checks that what Slurm will execute as
root is root's alone: the wrappers, hooks.toml, the interpreter (and every directory above it) and every
directory and file on its import path (site-packages included).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.hooks import HOOK_MODULES
from slurm_elastic.hooks.install import KILL_GRACE_S, MIN_INTERVAL_S, REQUIRED, read_baked
from slurm_elastic.hooks.safedir import check_root_file, check_root_tree
from slurm_elastic.hooks.settings import CONFIG_NAME, parse_settings

__all__ = ["Finding", "check_conf", "check_installation", "parse_slurm_conf"]

_IMPORTS = "; ".join(f"import slurm_elastic.hooks.{m}" for m in HOOK_MODULES)
_PROBE = f"{_IMPORTS}; import slurm_elastic.wire.channel, slurm_elastic; print(slurm_elastic.__version__)"
# Where imports come from, without importing the package: sys.path, and the package's own directory (an
# editable install maps it through a finder, outside sys.path).
_PATHS = (
    "import importlib.util, json, sys; spec = importlib.util.find_spec('slurm_elastic'); "
    "print(json.dumps({'executable': sys.executable, 'path': sys.path + "
    "list(spec.submodule_search_locations or []) if spec else sys.path}))"
)
MAX_REPORTED = 5


@dataclass(frozen=True)
class Finding:
    level: str  # ok | warn | FAIL
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.level:<4} {self.what}: {self.detail}"


def _safe_for_root(path: Path, st: os.stat_result) -> str | None:
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others ({stat.filemode(st.st_mode)})"
    return None


def _check_file(path: Path, as_root: bool, *, optional: bool) -> Finding:
    what = path.name
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Finding("ok" if optional else "FAIL", what, "not installed" + (" (optional)" if optional else ""))
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        return Finding("FAIL", what, f"{path} is not a regular file")
    if not st.st_mode & stat.S_IXUSR:
        return Finding("FAIL", what, f"{path} is not executable")
    unsafe = _safe_for_root(path, st) if as_root else None
    if unsafe:
        return Finding("FAIL", what, f"{path} is {unsafe}: Slurm runs it as root")
    return Finding("ok", what, f"{path} ({stat.filemode(st.st_mode)})")


def _check_root_code(python: str) -> list[Finding]:
    """The interpreter the wrappers run and every entry of its import path (as `-I` gives it): root's, and
    writable by no one else. Otherwise any user who can change one of them runs code as root on every node."""
    try:
        done = subprocess.run([python, "-I", "-c", _PATHS], capture_output=True, text=True, timeout=60, check=False)
        info = json.loads(done.stdout)
        executable, path = str(info["executable"]), list(dict.fromkeys(str(p) for p in info["path"] if p))
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return []  # the import probe reports an interpreter that does not run
    unsafe = [why for why in dict.fromkeys(map(check_root_file, (python, executable))) if why]
    what = f"{python}" + (f" ({executable})" if executable != python else "")
    findings = [Finding("FAIL", "interpreter owner", f"{'; '.join(unsafe)}: Slurm runs it as root") if unsafe
                else Finding("ok", "interpreter owner", f"{what}: root's only")]  # fmt: skip
    issues: list[str] = []
    walked: list[str] = []
    for entry in path:
        if any(entry.startswith(done.rstrip("/") + "/") for done in walked):
            continue  # inside a directory already walked (the standard library holds site-packages)
        walked.append(entry)
        if os.path.isfile(entry):
            why = check_root_file(entry)
            issues += [why] if why else []
        else:
            issues += check_root_tree(entry, limit=MAX_REPORTED)
        if len(issues) >= MAX_REPORTED:
            break
    if issues:
        detail = "; ".join(issues[:MAX_REPORTED]) + ": Slurm imports from it as root"
        findings.append(Finding("FAIL", "import path", detail))
    else:
        findings.append(Finding("ok", "import path", f"{len(path)} entries (site-packages included), root's only"))
    return findings


def _check_python(prefix: Path, as_root: bool = False) -> tuple[list[Finding], int | None]:
    try:
        baked = read_baked((prefix / "prolog").read_text())
    except OSError:
        return [], None
    python = baked.get("SE_PYTHON", "")
    timeout = int(baked["SE_TIMEOUT_S"]) if baked.get("SE_TIMEOUT_S", "").isdigit() else None
    findings = []
    if baked.get("SE_HOOKS_DIR") != str(prefix):
        findings.append(
            Finding("warn", "hooks dir", f"wrappers say {baked.get('SE_HOOKS_DIR')!r}, not {str(prefix)!r}")
        )
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [*findings, Finding("FAIL", "interpreter", f"{python!r} does not run: {exc}")], timeout
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return [*findings, Finding("FAIL", "interpreter", f"{python} cannot import the hooks: {last}")], timeout
    findings.append(Finding("ok", "interpreter", f"{python} (slurm-elastic {done.stdout.strip()})"))
    if as_root:
        findings += _check_root_code(python)
    return findings, timeout


def _check_config(prefix: Path, as_root: bool, timeout_s: int | None) -> Finding:
    path = prefix / CONFIG_NAME
    try:
        st = path.lstat()
        if as_root and _safe_for_root(path, st):
            return Finding("FAIL", CONFIG_NAME, f"{path} is {_safe_for_root(path, st)}: the hooks would ignore it")
        settings = parse_settings(tomllib.loads(path.read_text()), None, str(path))
    except FileNotFoundError:
        return Finding("ok", CONFIG_NAME, "absent: defaults apply")
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as exc:
        return Finding("FAIL", CONFIG_NAME, str(exc))
    if timeout_s is not None and settings.watch_s > timeout_s - 5:
        why = f"watch_s = {settings.watch_s} leaves too little of the wrappers' {timeout_s} s bound"
        return Finding("FAIL", CONFIG_NAME, why)
    return Finding("ok", CONFIG_NAME, str(path))


def parse_slurm_conf(text: str) -> dict[str, str]:
    """`Key=Value` lines -> {key lower-cased: value}; comments and blank lines skipped, last one wins."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found[key.strip().lower()] = value.strip()
    return found


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def check_conf(conf: dict[str, str], prefix: Path, hook_timeout_s: int | None) -> list[Finding]:
    """Do these slurm.conf settings run the hooks installed in `prefix`, and bound them safely?"""
    out = []
    for key, name in (("prolog", "prolog"), ("epilog", "epilog"), ("healthcheckprogram", "healthcheck")):
        value = conf.get(key)
        if value is None:
            out.append(Finding("FAIL", f"slurm.conf {key}", f"missing: add {key.title()}={prefix / name}"))
        elif Path(value) != prefix / name:
            out.append(Finding("FAIL", f"slurm.conf {key}", f"{value!r} is not {str(prefix / name)!r}"))
        else:
            out.append(Finding("ok", f"slurm.conf {key}", value))
    interval = _int(conf.get("healthcheckinterval"))
    if not interval:
        out.append(Finding("FAIL", "slurm.conf HealthCheckInterval", "missing or 0: the health check never runs"))
    elif interval < MIN_INTERVAL_S:
        why = f"{interval} s starves slurmctld's node pings (NOT_RESPONDING nodes never return); use {MIN_INTERVAL_S}"
        out.append(Finding("FAIL", "slurm.conf HealthCheckInterval", why))
    else:
        level = "ok" if interval <= 5 else "warn"
        out.append(Finding(level, "slurm.conf HealthCheckInterval", f"{interval} s (a drain reaches jobs within it)"))
    flags = [f.strip().lower() for f in conf.get("prologflags", "").split(",")]
    if "alloc" in flags:
        out.append(Finding("ok", "slurm.conf PrologFlags", conf["prologflags"]))
    else:
        out.append(
            Finding("FAIL", "slurm.conf PrologFlags", "no Alloc: the Prolog would run only at a job's first step")
        )
    bounds = [_int(conf.get(k)) for k in ("prologepilogtimeout", "prologtimeout", "epilogtimeout")]
    known = [b for b in bounds if b is not None]
    need = (hook_timeout_s or 0) + KILL_GRACE_S
    if not known:
        out.append(Finding("FAIL", "slurm.conf PrologEpilogTimeout", "missing: a hung hook could hold a node forever"))
    elif min(known) <= need:
        out.append(Finding("FAIL", "slurm.conf PrologEpilogTimeout", f"{min(known)} s; must exceed {need} s"))
    else:
        out.append(Finding("ok", "slurm.conf PrologEpilogTimeout", f"{min(known)} s"))
    return out


def check_installation(prefix: Path, slurm_conf: Path | None = None, *, as_root: bool | None = None) -> list[Finding]:
    as_root = os.geteuid() == 0 if as_root is None else as_root
    if not prefix.is_dir():
        return [Finding("FAIL", "prefix", f"{prefix} is not a directory")]
    findings = []
    unsafe = _safe_for_root(prefix, prefix.stat()) if as_root else None
    findings.append(Finding("FAIL" if unsafe else "ok", "prefix", f"{prefix} is {unsafe}" if unsafe else str(prefix)))
    for name in HOOK_MODULES:
        findings.append(_check_file(prefix / name, as_root, optional=name not in REQUIRED))
    python_findings, timeout = _check_python(prefix, as_root)
    findings += python_findings
    findings.append(_check_config(prefix, as_root, timeout))
    if slurm_conf is not None:
        try:
            findings += check_conf(parse_slurm_conf(slurm_conf.read_text()), prefix, timeout)
        except OSError as exc:
            findings.append(Finding("FAIL", "slurm.conf", f"cannot read {slurm_conf}: {exc.strerror}"))
    return findings
