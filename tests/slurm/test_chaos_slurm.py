"""`slurm-elastic chaos --slurm`, short: a node's link down past a lease, a node's death, a link down for
under a lease, a shrink, a one-way cut between two nodes and, last, the batch host cut off (its side stops,
the others requeue the job, which resumes from its checkpoint), on the real local cluster of separate hosts;
the job ends with the uninterrupted run's model, every sample once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slurm_elastic.testing.devcluster import LocalCluster

pytestmark = pytest.mark.timeout(600)


def test_a_short_chaos_run_on_slurm_ends_with_the_reference_model(hosts: LocalCluster) -> None:
    cmd = [sys.executable, "-m", "slurm_elastic", "chaos", "--slurm", "--seed", "996", "--faults", "6", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-20000:]
    summary = json.loads(done.stdout)
    assert [f["kind"] for f in summary["faults"]] == [
        "partition",
        "node_loss",
        "link_flap",
        "shrink",
        "one_way_cut",
        "batch_host_cut",
    ]
    assert all(f["fired"] for f in summary["faults"]), summary["faults"]
    assert summary["joins"] >= 4  # each fault but the flap and the cut last was refilled: an agent or a satellite
    assert summary["requeues"] == 1 and 0 <= summary["requeue_replayed_steps"] <= 10  # from its checkpoint
    assert (summary["lost_committed_steps"], summary["duplicate_samples"], summary["skipped_samples"]) == (0, 0, 0)
    assert summary["max_param_rel_diff"] <= summary["tolerance"] == 1e-6
    assert summary["ok"] and summary["steps"] == summary["faults"][-1]["step"] + 20
    assert not [j for j in hosts.slurm("squeue", "-h", "-o", "%i").stdout.split()]  # nothing left queued
