"""Real elastic training jobs on the local cluster with the admin hooks installed: an admin's DRAIN makes
the job leave the node at the next step boundary, FAIL at once, and a shrink is reported by the Epilog;
in each case the training ends exactly as an uninterrupted run (same model, every sample once).

The launcher watches Slurm's node states itself too (every node_watch_interval_s); here that watch is
set out of the way, so what the job learns comes from the hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.eventtypes import DrainRequested, MembershipChange, Recovered

from .elastic_jobs import ElasticSlurmJob, reference_model, submit_core
from .test_hooks_cluster import Hooked, hooked, hooks  # noqa: F401 - fixtures: the cluster with the hooks

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 40
NO_LAUNCHER_WATCH = {"SLURM_ELASTIC_NODE_WATCH_INTERVAL_S": "600", "SLURM_ELASTIC_MIN_NODES": "1"}


@pytest.fixture
def training(hooks: Hooked, tmp_path: Path) -> Iterator[ElasticSlurmJob]:  # noqa: F811 - the imported fixture
    job = submit_core(tmp_path / "job", nodes="4", steps=STEPS, pause=0.3, env=NO_LAUNCHER_WATCH)
    try:
        job.wait_step(6)
        yield job
    finally:
        job.cancel()


def first_drain(job: ElasticSlurmJob, node: str) -> DrainRequested:
    return next(e for e in job.of(DrainRequested) if node in e.nodes)


def test_admin_drain_leaves_at_the_next_step_boundary_with_nothing_lost(
    hooks: Hooked,  # noqa: F811
    training: ElasticSlurmJob,
    tmp_path: Path,
) -> None:
    hooks.cluster.slurm("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=pytest maintenance")
    training.wait("n3 to leave", lambda: training.worlds()[-1:] == [3], timeout=60)
    drain = first_drain(training, "n3")
    assert (drain.source, drain.mode) == ("healthcheck", "boundary")
    change = training.of(MembershipChange)[-1]
    assert change.cause == "drain" and change.boundary_step is not None
    assert not training.of(Recovered)  # no step aborted or re-run
    training.wait_finished()
    training.assert_same_training(reference_model(tmp_path.parent, STEPS))


def test_admin_fail_leaves_at_once(hooks: Hooked, training: ElasticSlurmJob, tmp_path: Path) -> None:  # noqa: F811
    hooks.cluster.slurm("scontrol", "update", "NodeName=n3", "State=FAIL", "Reason=pytest failing")
    training.wait("n3 to leave", lambda: training.worlds()[-1:] == [3], timeout=60)
    drain = first_drain(training, "n3")
    assert (drain.source, drain.mode) == ("healthcheck", "now")
    change = training.of(MembershipChange)[-1]
    assert change.boundary_step is None  # abrupt: the step in flight is aborted and run again by 3 nodes
    training.wait_finished()
    training.assert_same_training(reference_model(tmp_path.parent, STEPS))


def test_shrink_is_reported_by_the_epilog_before_any_heartbeat_timeout(
    hooks: Hooked,  # noqa: F811
    training: ElasticSlurmJob,
    tmp_path: Path,
) -> None:
    hooks.cluster.slurm("scontrol", "update", f"JobId={training.job_id}", "NumNodes=3")
    training.wait("the job to shrink to 3", lambda: training.worlds()[-1:] == [3], timeout=60)
    (released,) = {"n1", "n2", "n3", "n4"} - set(training.info().nodes)
    by_epilog = lambda: [e for e in training.of(DrainRequested) if e.source == "epilog"]  # noqa: E731
    training.wait("the epilog's report", lambda: bool(by_epilog()))
    events = training.events()
    reported = next(i for i, e in enumerate(events) if e["event"] == "drain_requested" and e["source"] == "epilog")
    report = DrainRequested.from_event(events[reported])
    assert report.nodes == (released,) and report.mode == "now"
    timeouts = [i for i, e in enumerate(events) if e["event"] in ("node_unresponsive", "hang_evicted")]
    assert all(i > reported for i in timeouts), "a heartbeat timeout fired before the epilog's report"
    training.wait_finished()
    training.assert_same_training(reference_model(tmp_path.parent, STEPS))
