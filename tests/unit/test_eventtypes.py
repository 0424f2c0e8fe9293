"""The event catalogue (eventtypes): each kind written as its type reads back as the same value, a record that
lacks a field is refused by name, and the coordinator writes no catalogued kind by hand."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import slurm_elastic
from slurm_elastic.events import EventLog, EventsFile
from slurm_elastic.eventtypes import (
    CATALOGUE,
    AgentRelaunched,
    AgentRelaunchGivenUp,
    CheckpointFallback,
    CollectiveFault,
    Commit,
    ConnectionRefused,
    ControlLoopFailed,
    CoordinatorPaused,
    CoordinatorStarted,
    DrainRequested,
    Event,
    EventFormatError,
    GenerationReady,
    HangEvicted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobSuspended,
    KeepPending,
    MembershipChange,
    MessageDropped,
    NodeLost,
    NodeReadmitted,
    NodeRegistered,
    NodeUnresponsive,
    PeersUnreachable,
    Progress,
    Recovered,
    RestartAll,
    SlurmJobStarted,
    StateLost,
    UserFailure,
    WorkerExited,
    WorkerRegistered,
    of_kind,
    summarize,
)

SAMPLES: list[Event] = [
    Commit(3, 2, 4, 1.25, 100.5, samples=64, received=100.75),
    MembershipChange(2, "lost local1", 4, 3, ("local0:0", "local2:0", "local3:0"), (), ("local1:0",), None, "Lost"),
    GenerationReady(
        "local0:0",
        2,
        "lost local1",
        3,
        0.01,
        0.02,
        0.03,
        7,
        (2,),
        (0, 1),
        808,
        "joiner",
        lost_committed_steps=0,
        batch_policy="preserve",
        lr_factor=1.0,
        reduce_dtype="float32",
        buckets=2,
    ),
    GenerationReady(
        "n1:0",
        5,
        "join",
        4,
        0.1,
        0.2,
        0.3,
        9,
        (),
        (),
        0,
        "in sync",
        strategy="fsdp2",
        mirrors=True,
        shard_group=2,
        replica_groups=2,
    ),
    Recovered(2, 8, 0.15, 7),
    CheckpointFallback(20, 10, 10),
    Progress(9, 2.5, 3, 2, None),
    NodeRegistered("n1", "host1", 1, "123"),
    WorkerRegistered("n1:0", "n1", 4242, -1),
    NodeLost("n2", ("n2:0",)),
    DrainRequested(("n3",), "graceful", "maintenance", "epilog"),
    CoordinatorStarted("127.0.0.1:4000", 4, "in_process"),
    SlurmJobStarted("123", ("n1", "n2"), 0),
    WorkerExited("n1:0", "n1", -9, False, None),
    UserFailure("n1:0", "ValueError at train.py:12", 2),
    CollectiveFault("n1:0", 3, "no new generation after a fault"),
    StateLost("n1:0", 3, "no live holder of shard 1"),
    NodeUnresponsive("n2", "no heartbeat for 10.2 s"),
    PeersUnreachable(7, 3, ("n2>n3", "n3>n2"), ("n3",), 0.012),
    NodeReadmitted("n3", ("n3:0:1",), 41.5),
    HangEvicted("n2:0", "hang", "in phase compute for 31 s"),
    RestartAll("every holder lost", ("n1", "n2")),
    JobFinished("all steps done", 40),
    JobSuspended("preempted", 12),
    JobCancelled("stopped by the user (Ctrl-C)", 7),
    JobFailed("the same exception 3 times"),
    CoordinatorPaused(12.5),
    AgentRelaunched("n3", "123", 1),
    AgentRelaunchGivenUp("n3", "123", "3 attempts"),
    MessageDropped("n1:0:0", "ValueError: x"),
    KeepPending(2, None),
    ConnectionRefused("bad proof", "('127.0.0.1', 5000)"),
    ControlLoopFailed("boom", loop="ticker"),
]


def test_every_catalogued_kind_has_a_sample_and_a_kind_of_its_own() -> None:
    kinds = [t.KIND for t in CATALOGUE]
    assert len(set(kinds)) == len(kinds)
    assert {type(s) for s in SAMPLES} == set(CATALOGUE)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_an_event_written_to_the_log_reads_back_as_the_same_value(tmp_path: Path, event: Event) -> None:
    log = EventLog("job-1", tmp_path / "events.jsonl")
    written = log.record(event, quiet=True)
    read = EventsFile(tmp_path / "events.jsonl", "test").of(type(event))
    assert read == [dataclasses.replace(event, time=written["time"])]
    assert of_kind(log.all(), type(event)) == read  # the record kept in memory reads the same
    line = json.loads((tmp_path / "events.jsonl").read_text())
    assert line["event"] == event.KIND and line["job"] == "job-1"


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_a_record_without_a_required_field_is_refused_by_kind_and_name(event: Event) -> None:
    required = [
        f.name
        for f in dataclasses.fields(event)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    record: dict[str, Any] = {"event": event.KIND, **event.fields()}
    del record[required[-1]]
    with pytest.raises(EventFormatError, match=rf"^a {event.KIND} event without '{required[-1]}'"):
        type(event).from_event(record)


def test_fields_a_reader_does_not_know_are_ignored_and_other_kinds_skipped() -> None:
    lost = NodeLost("n2", ("n2:0",))
    records = [
        {"event": "progress_of_the_future", "x": 1},
        {"event": "node_lost", "node": "n2", "workers": ["n2:0"], "added_later": True},
    ]
    assert of_kind(records, NodeLost) == [lost]


def test_a_commit_line_written_before_samples_and_received_were_reads_with_the_workers_time() -> None:
    old = {"event": "commit", "step": 4, "generation": 1, "world": 2, "loss": 0.5, "worker_time": 12.0}
    assert of_kind([old], Commit) == [Commit(4, 1, 2, 0.5, 12.0, samples=0, received=12.0)]


def test_the_package_writes_no_catalogued_kind_by_hand() -> None:
    """`emit("commit", ...)` would write a commit the type does not know of: every catalogued kind is written
    through `EventLog.record(its type)`."""
    kinds = {t.KIND for t in CATALOGUE}
    by_hand = []
    for path in Path(slurm_elastic.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and first.value in kinds:
                    by_hand.append(f"{path.name}:{node.lineno} {first.value}")
    assert by_hand == []


def test_what_a_worker_reports_of_a_generation_is_all_in_the_type() -> None:
    """The coordinator reads a worker's `generation_ready` through the type, which keeps only its fields: each
    field a worker sends (the runtime's, the step plan's, each strategy's) must be one of them."""
    import torch

    from slurm_elastic.decide.batching import PreserveGlobalBatch, plan_step
    from slurm_elastic.wire.messages import Assign
    from slurm_elastic.worker.membership import runtime as rt
    from slurm_elastic.worker.phases import PhaseHooks
    from slurm_elastic.worker.replicated.strategy import ReplicatedStrategy
    from slurm_elastic.worker.strategy import SyncResult

    sent: list[Any] = []
    runtime = rt.Runtime.__new__(rt.Runtime)
    runtime.rank, runtime.generation, runtime.world = 0, 2, 3
    runtime.send = sent.append  # type: ignore[method-assign]
    ann = Assign(generation=2, rank=0, ranks=["a:0", "b:0", "c:0"], boundary_step=None, cause="start")
    entered = rt.Entered(ann, SyncResult(5, (0,), (1, 2), "fresh", 10, 0.1), 0.1, 0.2)
    strategy = ReplicatedStrategy(
        torch.nn.Linear(2, 1), torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), None, {},
        reduce_dtype="float32", bucket_mb=1.0, clip=None, phases=PhaseHooks(), change_requested=lambda: False,
    )  # fmt: skip
    plan = plan_step(PreserveGlobalBatch(8, 2), 3)
    sharded_fields = {"strategy", "mirrors", "shard_group", "replica_groups"}  # sharded.strategy's
    runtime.report_generation(entered, {"batch_policy": plan.reason, "lr_factor": plan.lr_factor})
    runtime.report_generation(entered, strategy.generation_fields() | dict.fromkeys(sharded_fields))
    known = {f.name for f in dataclasses.fields(GenerationReady)}
    for message in sent:
        assert set(message.fields) <= known, set(message.fields) - known


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_kind_tells_a_person_what_happened_in_one_line(event: Event) -> None:
    record = {"event": event.KIND, "job": "j", "time": 1.0, **event.fields()}
    line = summarize(record)
    assert line == event.summary() and line.strip() and "\n" not in line


def test_the_changes_a_person_follows_read_as_sentences() -> None:
    change = {"event": "membership_change", "time": 1.0, **SAMPLES[1].fields()}
    assert summarize(change) == "generation 2: world 4 -> 3 (lost local1); left local1:0"
    drain = DrainRequested(("n3", "n4"), "now", "n3 left running job 55", "epilog")
    assert drain.summary() == "n3, n4 to leave (now, from the epilog): n3 left running job 55"
    assert NodeLost("n2", ()).summary() == "n2 lost, with no worker"


def test_a_plain_or_broken_record_is_shown_as_its_scalar_fields() -> None:
    plain = {"event": "shard_refused", "job": "j", "time": 1.0, "detail": "digest", "ranks": [1, 2], "step": None}
    assert summarize(plain) == "detail=digest"
    short = {"event": "membership_change", "job": "j", "time": 1.0, "generation": 3, "cause": "join"}
    assert summarize(short) == "generation=3 cause=join"  # a field missing: not the type's sentence
    wrong = {"event": "recovered", "generation": 1, "step": 2, "detect_to_commit_s": "soon", "last_step_before": 1}
    assert summarize(wrong) == "generation=1 step=2 detect_to_commit_s=soon last_step_before=1"
