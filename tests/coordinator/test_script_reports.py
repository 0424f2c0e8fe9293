"""What the coordinator keeps of its workers' scripts (`coordinator.scripts`): each report's verdict, and
nothing kept longer than it matters."""

from __future__ import annotations

from slurm_elastic.coordinator.scripts import MAX_TRACEBACKS, ScriptReports
from slurm_elastic.decide.failures import ExitRecord
from slurm_elastic.wire import messages as msg


def failure(worker: str, signature: str = "ValueError: x at train.py:3 in main", fatal: bool = False) -> msg.Failure:
    return msg.Failure(worker_id=worker, signature=signature, traceback=f"Traceback ...\n{signature}\n", fatal=fatal)


def test_the_same_failure_ends_the_job_at_the_bound_and_a_misuse_at_once() -> None:
    reports = ScriptReports(max_identical_failures=2)
    assert reports.failed(failure("a:0:0")) is None
    verdict = reports.failed(failure("b:0:0"))
    assert verdict is not None and "2 times (limit 2)" in verdict
    misuse = reports.failed(failure("c:0:0", "UsageError: job.save() called during step 3", fatal=True))
    assert misuse == "the training script misused the job on c:0:0: UsageError: job.save() called during step 3"


def test_a_lost_worker_that_raised_is_named_for_it_once() -> None:
    reports = ScriptReports(3)
    reports.failed(failure("a:0:0"))
    assert reports.cause_of_loss("a:0:0", "connection closed").startswith("the script of a:0:0 raised ValueError")
    assert reports.cause_of_loss("a:0:0", "connection closed") == "connection closed"
    assert reports.pending_causes() == 0


def test_tracebacks_are_bounded_and_the_last_one_is_forgotten_once_a_generation_forms() -> None:
    reports = ScriptReports(10_000)
    for i in range(MAX_TRACEBACKS + 5):
        reports.failed(failure(f"w{i}:0:0", f"E{i}: at x.py:{i}"))
        reports.cause_of_loss(f"w{i}:0:0", "gone")
    assert len(reports.tracebacks) == MAX_TRACEBACKS and reports.last_traceback is not None
    reports.exited_early(ExitRecord("n1:0:0", "n1", 2, "usage: x\n", False, final=False), {"n1": 2}, 0)
    reports.generation_formed()
    assert reports.last_traceback is None and reports.early_exits == []


def test_every_loop_must_be_the_first_ones_until_the_scripts_start_again() -> None:
    reports = ScriptReports(3)
    assert reports.loop_opened("a:0:0", {"total_steps": 20}) is None
    assert reports.loop_opened("b:0:0", {"total_steps": 20}) is None
    difference = reports.loop_opened("c:0:0", {"total_steps": 21})
    assert difference is not None and "total_steps 20 on a:0:0, 21 on c:0:0" in difference
    reports.scripts_restarted()
    assert reports.loop_opened("c:0:0", {"total_steps": 21}) is None


def test_an_early_exit_alike_on_every_node_is_a_verdict_with_its_first_words() -> None:
    reports = ScriptReports(3)
    tail = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'foo'\n"
    assert reports.exited_early(ExitRecord("n1:0:0", "n1", 1, tail, False, final=False), {"n1": 1, "n2": 1}, 0) is None
    verdict = reports.exited_early(ExitRecord("n2:0:0", "n2", 1, tail, False, final=False), {"n1": 1, "n2": 1}, 0)
    assert verdict is not None and verdict.endswith("No module named 'foo'") and reports.first_words() == tail
