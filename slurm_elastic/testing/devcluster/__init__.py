"""A local Slurm test cluster: one slurmctld and four slurmds (n1..n4) on this machine.

Command line: `python -m slurm_elastic.testing.devcluster {up,down,status,env}` (see `make cluster-up`).
From Python::

    cluster = LocalCluster()          # state in <repo>/.cluster, or $SLURM_ELASTIC_CLUSTER_DIR
    cluster.up()                      # idempotent; installs packages and starts munged if needed
    subprocess.run(["srun", "-N4", "hostname"], env=cluster.command_env())
    cluster.kill_node("n3")           # slurmd, slurmstepds and tasks of n3 die at once
    cluster.restart_node("n3")        # back in service (ReturnToService=2)
    cluster.down()

Nodes have 2 CPUs and jobs share nodes (CR_CPU): a job preempts a `train` job only when it needs
those CPUs, so preemption tests submit with `--exclusive`. A requeued job waits 10 s (AuthInfo
cred_expire), not Slurm's default 120 s; a preempted job is killed after GraceTime, but slurmctld checks
that on a 30 s timer, so preemption takes 5 to 35 s.

`python -m slurm_elastic.testing.devcluster.capture DIR` saves literal outputs of this Slurm for parser tests.
"""

from __future__ import annotations

from slurm_elastic.testing.devcluster.cluster import LocalCluster
from slurm_elastic.testing.devcluster.conf import (
    ClusterConf,
    Hooks,
    SlurmVersion,
    render_cgroup_conf,
    render_slurm_conf,
)
from slurm_elastic.testing.devcluster.layout import default_state_dir
from slurm_elastic.testing.devcluster.shell import ClusterError

__all__ = [
    "ClusterConf",
    "ClusterError",
    "Hooks",
    "LocalCluster",
    "SlurmVersion",
    "default_state_dir",
    "render_cgroup_conf",
    "render_slurm_conf",
]
