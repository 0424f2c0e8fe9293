from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurm_adapter.slurm_fixtures import fixture_text
from slurm_elastic.errors import SlurmError, SlurmParseError
from slurm_elastic.slurm.parse import json_version, parse_jobs_json, parse_nodes_json, parse_sinfo_json
from slurm_elastic.slurm.records import SlurmVersion


@pytest.mark.parametrize(
    ("relpath", "ids", "version"),
    [
        ("22.05/doc_squeue_json.json", ["21", "22", "23", "24", "26"], SlurmVersion(22, 5, 8)),
        ("24.05/doc_squeue_json.json", ["101", "102", "103", "104", "105", "106", "108"], SlurmVersion(24, 5, 3)),
        ("24.11/doc_squeue_json.json", ["101", "102", "103", "104", "105", "106", "108"], SlurmVersion(24, 11, 1)),
    ],
)
def test_squeue_json_common_shape(relpath: str, ids: list[str], version: SlurmVersion) -> None:
    text = fixture_text(relpath)
    jobs = {j.job_id: j for j in parse_jobs_json(text)}
    assert list(jobs) == ids
    assert json_version(text) == version
    first = jobs[ids[0]]
    assert first.name == "train llama" and first.user == "alice" and first.partition == "train"
    assert first.state == "RUNNING" and first.nodes == ("n1", "n2", "n3", "n4") and first.num_nodes == 4
    assert first.batch_host == "n1" and first.restart_count == 0 and first.time_limit_minutes is None
    assert first.array_job_id is None and first.het_job_id is None
    pending = jobs[ids[1]]
    assert pending.is_pending and pending.nodes == () and pending.batch_host is None
    assert pending.reason == "Resources" and pending.start_time is None and pending.time_limit_minutes == 60
    requeued = jobs[ids[2]]
    assert requeued.restart_count == 1 and requeued.reason == "BeginTime"
    shrinking = jobs[ids[3]]
    assert shrinking.state == "COMPLETING" and shrinking.nodes == ("n2", "n3")
    task = jobs[ids[-1]]
    assert task.state == "CANCELLED" and task.is_finished
    assert (task.array_job_id, task.array_task_id) == ({"22.05": "25"}.get(relpath[:5], "107"), "1")


def test_v041_lists_carry_base_state_and_flags() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(fixture_text("24.11/doc_squeue_json.json"))}
    assert (jobs["103"].state, jobs["103"].base_state, jobs["103"].flags) == (
        "REQUEUED",
        "PENDING",
        frozenset({"REQUEUED"}),
    )
    assert (jobs["104"].state, jobs["104"].base_state) == ("COMPLETING", "RUNNING")
    assert jobs["104"].is_running and not jobs["104"].is_finished
    assert [(jobs[i].het_job_id, jobs[i].het_job_offset) for i in ("105", "106")] == [("105", 0), ("105", 1)]
    assert jobs["101"].submit_time == datetime.fromtimestamp(1746693311, UTC)
    assert jobs["108"].comment == "stopped by operator"


def test_v039_23_02() -> None:
    text = fixture_text("23.02/doc_squeue_json.json")
    jobs = parse_jobs_json(text)
    assert json_version(text) == SlurmVersion(23, 2, 4)
    held, done, run = jobs
    assert held.state == "PENDING" and held.restart_count == 1 and held.reason == "JobHeldUser"
    assert (held.array_job_id, held.array_task_id) == ("52173767", "1470")
    assert done.state == "COMPLETED" and done.nodes == ("cs66",) and done.is_finished
    assert run.nodes == ("cs60", "cs61", "cs62", "cs63") and run.batch_host == "cs60"


def test_scontrol_json_show_job_and_missing() -> None:
    (job,) = parse_jobs_json(fixture_text("24.11/doc_scontrol_show_job_json.json"))
    assert job.job_id == "101" and job.state == "RUNNING"
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        parse_jobs_json(fixture_text("24.11/doc_scontrol_show_job_json_missing.json"))


def test_scontrol_json_show_node() -> None:
    nodes = {n.name: n for n in parse_nodes_json(fixture_text("24.11/doc_scontrol_show_node_json.json"))}
    assert nodes["n1"].usable and nodes["n2"].state == "MIXED"
    assert nodes["n3"].drained and nodes["n3"].reason == "health check: GPU 3 ECC errors"
    assert nodes["n4"].down and nodes["n4"].flags == {"NOT_RESPONDING"}
    assert nodes["n1"].partitions == ("train", "infer")


@pytest.mark.parametrize("relpath", ["23.02/doc_sinfo_N_json.json", "24.11/doc_sinfo_N_json.json"])
def test_sinfo_json(relpath: str) -> None:
    nodes = {n.name: n for n in parse_sinfo_json(fixture_text(relpath))}
    if relpath.startswith("23.02"):
        assert nodes["localhost"].state == "ALLOCATED" and nodes["localhost"].partitions == ("debug",)
        return
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].partitions == ("train", "infer")
    assert nodes["n3"].drained and nodes["n3"].reason.startswith("health check")
    assert nodes["n4"].down


def test_v038_node_state_word_and_flags() -> None:
    text = '{"errors": [], "nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "x"}]}'
    (node,) = parse_nodes_json(text)
    assert node.drained and node.reason == "x"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"errors": []}', "no `jobs` list"),
        ('{"jobs": [{"name": "x"}]}', "without job_id"),
        ('{"jobs": [{"job_id": 1, "job_state": "NAPPING"}]}', "unknown job state"),
    ],
)
def test_json_errors(text: str, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_jobs_json(text)
