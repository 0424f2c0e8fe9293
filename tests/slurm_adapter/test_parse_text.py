from __future__ import annotations

from datetime import datetime

import pytest

from slurm_adapter.slurm_fixtures import fixture_text
from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm.parse import (
    parse_duration_minutes,
    parse_key_values,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_nodes,
    parse_version,
)
from slurm_elastic.slurm.records import SlurmVersion


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_scontrol_show_job_one_line(version: str) -> None:
    jobs = {j.job_id: j for j in parse_scontrol_jobs(fixture_text(f"{version}/doc_scontrol_show_job_o.txt"))}
    assert sorted(jobs) == ["21", "22", "23", "24", "26"]
    run = jobs["21"]
    assert run.name == "train llama"  # a value with a space
    assert run.user == "alice"
    assert (run.state, run.base_state, run.flags) == ("RUNNING", "RUNNING", frozenset())
    assert run.nodes == ("n1", "n2", "n3", "n4") and run.num_nodes == 4 and run.batch_host == "n1"
    assert run.work_dir == "/home/alice/my runs"
    assert run.time_limit_minutes is None and run.reason == ""
    assert run.start_time == datetime.fromisoformat("2024-05-02T10:00:01").astimezone()
    pending = jobs["22"]
    assert pending.is_pending and pending.nodes == () and pending.batch_host is None
    assert pending.num_nodes == 2 and pending.reason == "Resources" and pending.start_time is None
    assert pending.comment == "elastic satellite of 21" and pending.time_limit_minutes == 60
    requeued = jobs["23"]
    assert requeued.restart_count == 1 and requeued.reason == "BeginTime"
    assert requeued.time_limit_minutes == 24 * 60
    completing = jobs["24"]
    assert (completing.state, completing.base_state) == ("COMPLETING", None)
    assert "COMPLETING" in completing.flags and not completing.is_finished
    task = jobs["26"]
    assert (task.array_job_id, task.array_task_id) == ("25", "1")
    assert task.is_finished and task.state == "CANCELLED"


def test_scontrol_show_job_multiline_het_components() -> None:
    comps = parse_scontrol_jobs(fixture_text("22.05/doc_scontrol_show_job_multiline.txt"))
    assert [(c.job_id, c.het_job_id, c.het_job_offset) for c in comps] == [("27", "27", 0), ("28", "27", 1)]
    assert comps[1].nodes == ("n2", "n3") and comps[1].batch_host == "n1"


def test_no_jobs() -> None:
    assert parse_scontrol_jobs("No jobs in the system\n") == []


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_scontrol_show_node_one_line(version: str) -> None:
    nodes = {n.name: n for n in parse_scontrol_nodes(fixture_text(f"{version}/doc_scontrol_show_node_o.txt"))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n2"].state == "ALLOCATED" and nodes["n2"].usable
    n3 = nodes["n3"]
    assert n3.draining and not n3.drained and not n3.usable
    # A free-text value with a `key=value` inside and scontrol's `[user@time]` stamp removed.
    assert n3.reason == "reclaim for inference: key=value stays text"
    assert n3.partitions == ("train", "infer")
    n4 = nodes["n4"]
    assert n4.down and n4.flags == {"NOT_RESPONDING"} and n4.reason == "Not responding"
    if version == "24.11":
        assert nodes["n1"].drained and nodes["n1"].reason == "GPU 3 ECC errors"
    else:
        assert nodes["n1"].state == "IDLE" and nodes["n1"].usable


def test_key_values_free_text_and_first_key_wins() -> None:
    fields = parse_key_values("JobId=1 JobName=a b=c d UserId=u(1) Nodes=n1 CPU_IDs=0 Nodes=n2")
    assert fields["JobName"] == "a b=c d" and fields["UserId"] == "u(1)" and fields["Nodes"] == "n1"


def test_key_values_rejects_garbage() -> None:
    with pytest.raises(SlurmParseError, match="Key=value"):
        parse_key_values("slurm_load_jobs error: Invalid job id specified")


def test_sinfo_text_nte() -> None:
    nodes = {n.name: n for n in parse_sinfo_nodes(fixture_text("22.05/doc_sinfo_N_NTE.txt"))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]  # n1 printed twice (two partitions): merged
    assert nodes["n3"].draining and nodes["n3"].reason == "reclaim for inference | piped"
    assert nodes["n4"].down and nodes["n4"].state == "DOWN" and nodes["n1"].reason == ""


def test_sinfo_text_with_partitions() -> None:
    text = fixture_text("22.05/doc_sinfo_N_NTPE.txt")
    nodes = {n.name: n for n in parse_sinfo_nodes(text, fields="NTPE")}
    assert nodes["n1"].partitions == ("train", "infer")
    assert nodes["n2"].state == "MIXED" and nodes["n2"].flags == {"PLANNED"}
    assert nodes["n3"].drained and nodes["n3"].reason == "maintenance"
    assert nodes["n4"].flags == {"POWERED_DOWN"} and not nodes["n4"].usable


def test_sinfo_text_errors() -> None:
    with pytest.raises(SlurmParseError, match="fields"):
        parse_sinfo_nodes("n1|idle", fields="NTE")
    with pytest.raises(SlurmParseError, match="E last"):
        parse_sinfo_nodes("", fields="NET")
    with pytest.raises(SlurmParseError, match="unknown node state"):
        parse_sinfo_nodes("n1|sleepy|none")


def test_sbatch_parsable() -> None:
    assert parse_sbatch_parsable(fixture_text("22.05/doc_sbatch_parsable.txt")) == "21"
    assert parse_sbatch_parsable(fixture_text("22.05/doc_sbatch_parsable_cluster.txt")) == "21"
    with pytest.raises(SlurmParseError, match="expected"):
        parse_sbatch_parsable("Submitted batch job 5\n")


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_sbatch_test_only(version: str) -> None:
    result = parse_sbatch_test_only(fixture_text(f"{version}/doc_sbatch_test_only.txt"))
    assert result.job_id.isdigit() and result.processors > 0 and result.partition == "train"
    assert result.nodes[0] == "n1"


def test_sbatch_test_only_error() -> None:
    with pytest.raises(SlurmParseError, match="allocation failure"):
        parse_sbatch_test_only(fixture_text("22.05/doc_sbatch_test_only_error.txt"))


@pytest.mark.parametrize(
    ("relpath", "version"),
    [
        ("22.05/doc_version.txt", SlurmVersion(22, 5, 8)),
        ("24.05/doc_version.txt", SlurmVersion(24, 5, 3)),
        ("24.11/doc_version.txt", SlurmVersion(24, 11, 1)),
    ],
)
def test_version(relpath: str, version: SlurmVersion) -> None:
    assert parse_version(fixture_text(relpath)) == version


def test_version_order_and_errors() -> None:
    assert SlurmVersion(22, 5, 8) < SlurmVersion(23, 2) < SlurmVersion(24, 11, 1)
    assert str(SlurmVersion(22, 5, 8)) == "22.05.8"
    with pytest.raises(SlurmParseError, match="version"):
        parse_version("scontrol: command not found")


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("UNLIMITED", None), ("1-00:00:00", 1440), ("02:03:04", 124), ("30:00", 30), ("5", 5), ("2-12", 3600)],
)
def test_duration(text: str, minutes: int | None) -> None:
    assert parse_duration_minutes(text) == minutes
