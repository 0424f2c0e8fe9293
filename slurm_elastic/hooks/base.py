"""What every hook entry point shares: settings and log for this run, the Slurm client, the way it
finds a job's coordinator, and a `main` that turns any failure into one log line instead of a traceback.

Exit codes: 0 always, except a Prolog that found the node unhealthy (EX_REFUSE); the sh wrapper turns
that into Slurm's "do not start the job here" and every other code into a logged 0, so a broken
installation never drains a cluster.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurm_elastic.hooks.handle import HandleMissing, read_handle
from slurm_elastic.hooks.hookenv import HookInputError, handle_path_from_comment
from slurm_elastic.hooks.hooklog import HookLog
from slurm_elastic.hooks.settings import ENV_HOOKS_DIR, HookSettings, expand_node_path, load_settings
from slurm_elastic.jobdir import JobHandle

__all__ = ["EX_OK", "EX_REFUSE", "Run", "find_coordinator", "main", "start", "time_bound"]

EX_OK = 0
EX_REFUSE = 100
SLURM_TIMEOUT_S = 5.0
ENV_HOOK_TIMEOUT_S = "SLURM_ELASTIC_HOOK_TIMEOUT_S"  # the wrapper's hard bound (SE_TIMEOUT_S), exported by it
EXIT_MARGIN_S = 3.0  # what a hook keeps of that bound to log and exit on its own terms


def time_bound(environ: Mapping[str, str], default_s: float = 20.0) -> float:
    """Seconds this run has before its wrapper kills it."""
    value = environ.get(ENV_HOOK_TIMEOUT_S, "")
    return float(value) if value.isdigit() and int(value) > 0 else default_s


@dataclass
class Run:
    settings: HookSettings
    log: HookLog


def _quiet_library_logs() -> None:
    # An entry point configures logging: the library's debug lines (every Slurm command) stay out of
    # slurmd's log; the hook's own lines are written by HookLog.
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def start(hook: str, environ: Mapping[str, str], *, job: str | None, node: str | None) -> Run:
    """Load the settings (for `node`), open the log; a rejected config file is logged and defaults used."""
    _quiet_library_logs()
    settings, warning = load_settings(environ.get(ENV_HOOKS_DIR), node, environ)
    log = HookLog(hook, job=job, node=node, log_dir=settings.log_dir, use_syslog=settings.syslog)
    if warning:
        log.event("config", "ignored", error=warning)
    if settings.slurm_conf and "SLURM_CONF" not in os.environ:
        # The HealthCheckProgram gets no SLURM_CONF from slurmd; scontrol and squeue need one off the default path.
        os.environ["SLURM_CONF"] = settings.slurm_conf
    return Run(settings, log)


def find_coordinator(comment: str | None, uid: int, log: HookLog) -> JobHandle | None:
    """The coordinator named by an elastic job's comment, or None (logged: not elastic, or refused)."""
    try:
        path = handle_path_from_comment(comment)
        if path is None:
            log.event("find", "not_elastic")
            return None
        return read_handle(path, uid)
    except HandleMissing as exc:
        log.event("find", "gone", detail=str(exc))
        return None
    except HookInputError as exc:
        log.event("find", "refused", error=str(exc))
        return None


def spool_dir(settings: HookSettings, node: str, ask: Callable[[], str | None], log: HookLog) -> str | None:
    """SlurmdSpoolDir for the free-space check: from the settings, or from `scontrol show config`."""
    template = settings.spool_dir
    if template == "auto":
        try:
            template = ask() or ""
        except Exception as exc:  # a missing answer skips one check; it must not fail the hook
            log.event("spool", "unknown", error=f"{type(exc).__name__}: {exc}")
            return None
    return expand_node_path(template, node) if template else None


def main(hook: str, body: Callable[[Mapping[str, str]], int]) -> int:
    """Run `body(os.environ)`; an unexpected exception becomes one log line and exit 0."""
    try:
        return body(os.environ)
    except HookInputError as exc:
        HookLog(hook).event("parse", "refused", error=str(exc))
    except Exception as exc:  # never a traceback into slurmd's log, never a failed hook by accident
        HookLog(hook).event("run", "error", error=f"{type(exc).__name__}: {exc}")
    return EX_OK


def entry(hook: str, body: Callable[[Mapping[str, str]], int]) -> None:
    sys.exit(main(hook, body))
