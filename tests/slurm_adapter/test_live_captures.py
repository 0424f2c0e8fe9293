"""Cross-checks on real outputs of this project's 22.05.8 cluster (fixtures/22.05/adapter_live_*):
the text and JSON parsers must tell the same story about the same job and nodes."""

from __future__ import annotations

from slurm_adapter.slurm_fixtures import fixture_text
from slurm_elastic.slurm.parse import (
    json_version,
    parse_jobs_json,
    parse_sbatch_test_only,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_nodes,
    parse_version,
)
from slurm_elastic.slurm.records import SlurmVersion

LIVE = "22.05/adapter_live_"


def test_job_text_one_line_multi_line_and_json_agree() -> None:
    (one_line,) = parse_scontrol_jobs(fixture_text(LIVE + "scontrol_show_job_o.txt"))
    (multi_line,) = parse_scontrol_jobs(fixture_text(LIVE + "scontrol_show_job.txt"))
    from_json = {j.job_id: j for j in parse_jobs_json(fixture_text(LIVE + "squeue_json.json"))}["8"]
    assert one_line == multi_line
    assert one_line.name == "adapter live capture" and one_line.comment == "captured by the slurm adapter"
    assert (one_line.state, one_line.num_nodes, len(one_line.nodes)) == ("RUNNING", 2, 2)
    assert one_line.batch_host == one_line.nodes[0]
    same = ("job_id", "name", "user", "state", "partition", "nodes", "num_nodes", "batch_host", "restart_count")
    for attr in (*same, "work_dir", "comment", "time_limit_minutes", "start_time", "submit_time"):
        assert getattr(one_line, attr) == getattr(from_json, attr), attr


def test_nodes_text_and_sinfo_agree() -> None:
    scontrol = {n.name: n for n in parse_scontrol_nodes(fixture_text(LIVE + "scontrol_show_node_o.txt"))}
    sinfo = {n.name: n for n in parse_sinfo_nodes(fixture_text(LIVE + "sinfo_N_NTE.txt"))}
    assert sorted(scontrol) == sorted(sinfo) == ["n1", "n2", "n3", "n4"]
    for name, node in scontrol.items():
        other = sinfo[name]
        # sinfo's words hide some flags (ALLOCATED+PLANNED prints as `allocated`): compare what matters.
        assert other.flags <= node.flags, name
        assert (node.state, node.drain, node.down, node.usable) == (other.state, other.drain, other.down, other.usable)
        assert node.usable and node.partitions == ("train", "infer")


def test_version_and_test_only() -> None:
    assert parse_version(fixture_text(LIVE + "version.txt")) == SlurmVersion(22, 5, 8)
    assert json_version(fixture_text(LIVE + "squeue_json.json")) == SlurmVersion(22, 5, 8)
    estimate = parse_sbatch_test_only(fixture_text(LIVE + "sbatch_test_only.txt"))
    assert estimate.processors == 2 and len(estimate.nodes) == 2 and estimate.partition == "train"
