"""Whom the hooks tell, and which node state they set: pure decisions on Slurm's records."""

from __future__ import annotations

from slurm_elastic.hooks.checks import Problem
from slurm_elastic.hooks.policy import epilog_notice, node_event, node_update, slurmctld_notice
from slurm_elastic.slurm.records import JobInfo, NodeInfo

RUNNING_2 = JobInfo("40", state="RUNNING", base_state="RUNNING", nodes=("n1", "n2"))
COMPLETING = JobInfo("40", state="COMPLETING", base_state="COMPLETED", flags=frozenset({"COMPLETING"}), nodes=("n1",))
LOW_SHM = [Problem("shm", "degraded", "1 MB free")]
NO_GPU = [Problem("gpu", "fatal", "0 GPUs")]


def node(state: str = "IDLE", flags: tuple[str, ...] = (), reason: str = "") -> NodeInfo:
    return NodeInfo("n3", state, frozenset(flags), reason)


def test_shrink_of_a_running_core_job_is_told_now() -> None:
    notice = epilog_notice("40", "n3", RUNNING_2, handle_job_id="40")
    assert notice.send and notice.nodes == ("n3",) and notice.mode == "now"
    assert "left running job 40" in notice.why


def test_end_of_the_core_job_is_not_told() -> None:
    assert not epilog_notice("40", "n1", COMPLETING, handle_job_id="40").send
    assert not epilog_notice("40", "n1", None, handle_job_id="40").send


def test_end_of_a_satellite_is_told_to_the_core() -> None:
    for job in (COMPLETING, None, JobInfo("41", state="PREEMPTED", base_state="PREEMPTED")):
        notice = epilog_notice("41", "n4", job, handle_job_id="40")
        assert notice.send and notice.mode == "now" and "satellite job 41 of job 40" in notice.why


def test_slurmctld_view() -> None:
    notice = slurmctld_notice("41", ("n3", "n4"), handle_job_id="40")
    assert notice.send and notice.nodes == ("n3", "n4")
    assert not slurmctld_notice("40", ("n1",), handle_job_id="40").send
    assert not slurmctld_notice("41", (), handle_job_id="40").send


def test_node_events() -> None:
    assert node_event(None) is None
    assert node_event(node("MIXED")) is None
    assert node_event(node("MIXED", ("DRAIN",))) == "DRAIN"
    assert node_event(node("MIXED", ("FAIL",))) == "FAIL"  # 22.05: State=MIXED+FAIL
    assert node_event(node("IDLE", ("DRAIN", "FAIL"))) == "FAIL"
    assert node_event(node("DOWN", ("NOT_RESPONDING",))) is None


def test_unhealthy_node_is_drained_or_failed_once() -> None:
    assert node_update("healthcheck", node(), LOW_SHM, True) == ("DRAIN", "slurm-elastic healthcheck: shm: 1 MB free")
    assert node_update("healthcheck", node(), NO_GPU, True) == ("FAIL", "slurm-elastic healthcheck: gpu: 0 GPUs")
    assert node_update("healthcheck", node(flags=("DRAIN",)), LOW_SHM, True) is None
    assert node_update("healthcheck", node(flags=("DRAIN",)), NO_GPU, True)[0] == "FAIL"  # type: ignore[index]
    assert node_update("healthcheck", node(flags=("FAIL",)), LOW_SHM, True) is None  # never downgraded


def test_only_our_own_drain_is_lifted() -> None:
    ours = node(flags=("DRAIN",), reason="slurm-elastic prolog: shm: 1 MB free")
    admins = node(flags=("DRAIN",), reason="maintenance")
    assert node_update("healthcheck", ours, [], True) == ("RESUME", "")
    assert node_update("healthcheck", ours, [], False) is None
    assert node_update("healthcheck", admins, [], True) is None
    assert node_update("healthcheck", node(), [], True) is None
