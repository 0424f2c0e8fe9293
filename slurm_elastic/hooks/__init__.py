"""Admin hooks: Slurm's Prolog, Epilog, HealthCheckProgram and EpilogSlurmctld for elastic jobs.

Slurm runs the small sh wrappers of the repository's `hooks/` directory (installed by
`slurm-elastic hooks install`), which run `python -m slurm_elastic.hooks.<name>` under a hard timeout:

- prolog: node health before a job starts; drains the node and refuses the job on a problem.
- epilog: a node leaves an elastic job that goes on -> tell its coordinator now; clean the node.
- healthcheck: periodic node checks; a DRAIN/FAIL node -> tell its elastic jobs (boundary/now).
- epilog_slurmctld: a satellite job ends -> tell the core job's coordinator, from the controller.

A hook finds a job's coordinator through the job comment `slurm-elastic:<path of coordinator.json>`.
This package imports nothing heavy at import time: the health check may start every second.
See docs/admin-hooks.md.
"""

HOOK_MODULES = ("prolog", "epilog", "healthcheck", "epilog_slurmctld")

__all__ = ["HOOK_MODULES"]
