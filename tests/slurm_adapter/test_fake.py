from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.slurm.errors import JobNotFound, SlurmCommandError, SlurmRequestError
from slurm_elastic.testing.fakeslurm import FakeClock, FakeSlurm


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.sbatch"
    path.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --job-name=from-script\nsrun python train.py\n")
    return path


def test_submit_reads_sbatch_lines_and_args_win(script: Path) -> None:
    fake = FakeSlurm()
    job = fake.job(fake.submit(script))
    assert (job.name, job.num_nodes, job.state, job.user) == ("from-script", 2, "PENDING", "user")
    job = fake.job(fake.submit(script, args=["-N", "3", "--job-name=cli"]))
    assert (job.job_id, job.name, job.num_nodes) == ("2", "cli", 3)


def test_start_pending_fifo_on_free_nodes(script: Path) -> None:
    fake = FakeSlurm()
    first, second, third = (fake.submit(script) for _ in range(3))
    assert fake.start_pending() == [first, second]
    assert fake.job(first).nodes == ("n1", "n2") and fake.job(first).batch_host == "n1"
    assert fake.job(third).state == "PENDING"
    assert {n.name: n.state for n in fake.nodes()} == dict.fromkeys(["n1", "n2", "n3", "n4"], "ALLOCATED")
    fake.finish(first)
    assert fake.start_pending() == [third]


def test_test_only_queues_nothing_and_rejects_impossible(script: Path) -> None:
    fake = FakeSlurm()
    assert fake.submit(script, test_only=True) == "1"
    assert fake.jobs() == []
    with pytest.raises(SlurmCommandError, match="node configuration is not available"):
        fake.submit(script, args=["--nodes=5"], test_only=True)
    with pytest.raises(SlurmCommandError, match="node configuration"):
        fake.submit(script, args=["--partition=nope"])


def test_cancel_and_signal(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.submit(script)
    fake.start_pending()
    fake.cancel(job_id, signal="TERM", batch_only=True)
    assert fake.signals == [(job_id, "TERM", True)] and fake.job(job_id).state == "RUNNING"
    fake.cancel(job_id)
    assert fake.job(job_id).state == "CANCELLED" and fake.job(job_id).is_finished
    fake.cancel(job_id)  # idempotent, like scancel on a finished job
    assert all(n.state == "IDLE" for n in fake.nodes())
    with pytest.raises(JobNotFound):
        fake.cancel("99")


def test_requeue_counts_restarts_and_waits_begin_time(script: Path) -> None:
    clock = FakeClock()
    fake = FakeSlurm(clock=clock.now, requeue_delay=120)
    job_id = fake.submit(script)
    with pytest.raises(SlurmCommandError, match="pending"):
        fake.requeue(job_id)
    fake.start_pending()
    fake.requeue(job_id)
    job = fake.job(job_id)
    assert (job.state, job.restart_count, job.reason, job.nodes) == ("PENDING", 1, "BeginTime", ())
    assert fake.start_pending() == []  # not eligible before BeginTime
    clock.advance(120)
    assert fake.start_pending() == [job_id]
    assert fake.job(job_id).start_time == clock.now()


def test_resize_keeps_batch_host(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.submit(script, args=["--nodes=4"])
    fake.start_pending()
    fake.resize_job(job_id, num_nodes=2)
    job = fake.job(job_id)
    assert job.nodes == ("n1", "n2") and job.num_nodes == 2 and job.batch_host == "n1"
    assert [n.state for n in fake.nodes("n[3-4]")] == ["IDLE", "IDLE"]
    with pytest.raises(SlurmCommandError, match="batch host"):
        fake.resize_job(job_id, nodelist="n2")
    fake.resize_job(job_id, nodelist=["n1"])
    assert fake.job(job_id).nodes == ("n1",)
    with pytest.raises(SlurmCommandError, match="not available"):
        fake.resize_job(job_id, num_nodes=3)  # growth is not a resize in Slurm
    with pytest.raises(SlurmRequestError):
        fake.resize_job(job_id)


def test_drain_resume_and_down(script: Path) -> None:
    fake = FakeSlurm()
    fake.set_node_state("n[3-4]", "DRAIN", "reclaim")
    n3 = fake.nodes("n3")[0]
    assert n3.drained and n3.reason == "reclaim" and not n3.usable
    job_id = fake.submit(script, args=["--nodes=3"])
    assert fake.start_pending() == []  # only two undrained nodes
    fake.set_node_state(["n3"], "RESUME", "")
    assert fake.start_pending() == [job_id]
    fake.set_node_state("n2", "DRAIN", "health check")
    assert fake.nodes("n2")[0].draining
    fake.set_node_state("n2", "DOWN", "admin")
    assert fake.job(job_id).state == "NODE_FAIL"  # not --no-kill: the whole job ends
    assert fake.nodes("n2")[0].down
    with pytest.raises(SlurmCommandError):
        fake.set_node_state("n9", "DRAIN", "x")
    with pytest.raises(SlurmCommandError, match="not found"):
        fake.nodes("n9")


def test_fail_node_under_no_kill_keeps_the_rest(script: Path) -> None:
    fake = FakeSlurm()
    job_id = fake.submit(script, args=["--nodes=4", "--no-kill"])
    fake.start_pending()
    fake.fail_node("n3")
    job = fake.job(job_id)
    assert job.state == "RUNNING" and job.nodes == ("n1", "n2", "n4")
    node = fake.nodes("n3")[0]
    assert node.down and "NOT_RESPONDING" in node.flags
    fake.restore_node("n3")
    assert fake.nodes("n3")[0].usable
    fake.fail_node("n1")  # the batch host: the job cannot survive
    assert fake.job(job_id).state == "NODE_FAIL"


def test_preempt_requeues_or_ends(script: Path) -> None:
    fake = FakeSlurm()
    a = fake.submit(script)
    b = fake.submit(script, args=["--no-requeue"])
    fake.start_pending()
    fake.preempt(a)
    fake.preempt(b)
    assert (fake.job(a).state, fake.job(a).restart_count) == ("PENDING", 1)
    assert fake.job(b).state == "PREEMPTED" and fake.job(b).is_finished


def test_jobs_filters_finish_and_purge(script: Path) -> None:
    fake = FakeSlurm(partitions={"train": "n[1-2]", "infer": "n[3-4]"})
    a = fake.submit(script, args=["--job-name=a"])
    b = fake.submit(script, args=["--job-name=b", "--partition=infer"])
    fake.start_pending()
    fake.finish(b, "FAILED")
    assert [j.job_id for j in fake.jobs(states=["RUNNING"])] == [a]
    assert [j.job_id for j in fake.jobs(name="b", user="user")] == [b]
    assert fake.nodes("n3")[0].partitions == ("infer",)
    with pytest.raises(SlurmRequestError, match="finish state"):
        fake.finish(a, "RUNNING")
    fake.purge(b)
    with pytest.raises(JobNotFound):
        fake.job(b)
