"""The local cluster's slurm.conf and cgroup.conf are pure functions of their inputs."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from slurm_elastic.errors import SlurmError
from slurm_elastic.testing.devcluster.conf import (
    HOOK_NAMES,
    ClusterConf,
    Hooks,
    SlurmVersion,
    render_cgroup_conf,
    render_slurm_conf,
)
from slurm_elastic.testing.devcluster.hostnet import HostNetwork

pytestmark = pytest.mark.timeout(30)

STATE = Path("/srv/cluster state")  # a space: paths are written unquoted and Slurm reads to end of line
V2205 = SlurmVersion(22, 5, 8)
V2411 = SlurmVersion(24, 11, 5)
HOOK_KEYS = (
    "Prolog",
    "Epilog",
    "PrologSlurmctld",
    "EpilogSlurmctld",
    "PrologFlags",
    "PrologEpilogTimeout",
    "PrologTimeout",
    "EpilogTimeout",
    "HealthCheckProgram",
    "HealthCheckInterval",
)


def settings(text: str) -> dict[str, str]:
    """The global Key=Value lines (node and partition lines excluded)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or line.startswith(("NodeName=", "PartitionName=")):
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        assert key not in out, f"{key} set twice"
        out[key] = value
    return out


def records(text: str, kind: str) -> dict[str, dict[str, str]]:
    """NodeName=/PartitionName= lines as {name: {key: value}}."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"{kind}="):
            fields = dict(item.split("=", 1) for item in line.split())
            out[fields.pop(kind)] = fields
    return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm-wlm 22.05.8\n", SlurmVersion(22, 5, 8)),
        ("slurm 24.11.5", SlurmVersion(24, 11, 5)),
        ("slurm 25.05.0-0rc1", SlurmVersion(25, 5, 0)),
        ("slurm 23.11", SlurmVersion(23, 11, 0)),
    ],
)
def test_version_parse(text: str, expected: SlurmVersion) -> None:
    assert SlurmVersion.parse(text) == expected


def test_version_parse_rejects_garbage() -> None:
    with pytest.raises(SlurmError, match="cannot read a Slurm version"):
        SlurmVersion.parse("slurmctld: command not found")


def test_version_order_and_text() -> None:
    assert SlurmVersion(22, 5, 8) < SlurmVersion(24, 5) < SlurmVersion(24, 11, 5)
    assert str(SlurmVersion(24, 5, 2)) == "24.05.2"


@pytest.mark.parametrize("version", [V2205, V2411])
def test_core_settings(version: SlurmVersion) -> None:
    s = settings(render_slurm_conf(ClusterConf(state_dir=STATE, version=version)))
    assert s["SlurmctldHost"] == "localhost"
    assert s["SlurmctldPort"] == "16817"
    assert s["AuthType"] == "auth/munge"
    assert s["ProctrackType"] == "proctrack/linuxproc"
    assert s["TaskPlugin"] == "task/none"
    assert s["SlurmUser"] == s["SlurmdUser"] == "root"
    assert s["PreemptType"] == "preempt/partition_prio"
    assert s["PreemptMode"] == "REQUEUE"
    assert s["ReturnToService"] == "2"
    assert s["SchedulerParameters"] == "permit_job_expansion,bf_interval=2,sched_interval=2"
    assert s["SlurmdTimeout"] == "30"
    assert s["SlurmctldTimeout"] == "30"
    assert s["KillWait"] == "5"
    assert s["SlurmdDebug"] == "debug2"  # slurmstepd's teardown is in the node's log
    # A requeued job waits cred_expire seconds (Slurm's default 120) before it may start again.
    assert s["AuthInfo"] == "cred_expire=10"
    # Every file lives under the state dir, and %n gives each slurmd its own spool, pid file and log.
    assert s["StateSaveLocation"] == f"{STATE}/state"
    assert s["SlurmdSpoolDir"] == f"{STATE}/spool/%n"
    assert s["SlurmdPidFile"] == f"{STATE}/slurmd.%n.pid"
    assert s["SlurmdLogFile"] == f"{STATE}/log/slurmd.%n.log"
    assert s["SlurmctldLogFile"] == f"{STATE}/log/slurmctld.log"
    assert s["SlurmctldPidFile"] == f"{STATE}/slurmctld.pid"
    # Defaults that 23.11+ no longer ships as plugins are left out for every version.
    assert not {"SwitchType", "AccountingStorageType", "JobCompType"} & set(s)
    assert not set(HOOK_KEYS) & set(s)


@pytest.mark.parametrize("version", [V2205, V2411])
def test_nodes_on_localhost_with_distinct_ports(version: SlurmVersion) -> None:
    nodes = records(render_slurm_conf(ClusterConf(state_dir=STATE, version=version)), "NodeName")
    assert list(nodes) == ["n1", "n2", "n3", "n4"]
    assert [n["Port"] for n in nodes.values()] == ["17001", "17002", "17003", "17004"]
    for node in nodes.values():
        assert node["NodeAddr"] == "127.0.0.1"
        assert node["NodeHostname"] == "localhost"
        assert node["CPUs"] == "2"


def test_nodes_as_hosts_each_at_its_own_address() -> None:
    net = HostNetwork(("n1", "n2", "n3", "n4"))
    text = render_slurm_conf(ClusterConf(state_dir=STATE, version=V2411, network=net))
    nodes = records(text, "NodeName")
    assert [n["NodeAddr"] for n in nodes.values()] == ["10.77.0.11", "10.77.0.12", "10.77.0.13", "10.77.0.14"]
    # The nodes reach the controller at the management bridge's address, not at their own loopback.
    assert settings(text)["SlurmctldHost"] == "localhost(10.77.0.1)"


def test_node_count_and_ports_follow_inputs() -> None:
    conf = ClusterConf(state_dir=STATE, version=V2205, node_count=2, slurmd_base_port=18000, ctld_port=18999)
    text = render_slurm_conf(conf)
    assert [n["Port"] for n in records(text, "NodeName").values()] == ["18000", "18001"]
    assert settings(text)["SlurmctldPort"] == "18999"
    assert conf.slurmd_port("n2") == 18001


@pytest.mark.parametrize("version", [V2205, V2411])
def test_partitions_exactly(version: SlurmVersion) -> None:
    parts = records(render_slurm_conf(ClusterConf(state_dir=STATE, version=version)), "PartitionName")
    assert parts == {
        "train": {
            "Nodes": "ALL",
            "Default": "YES",
            "MaxTime": "INFINITE",
            "State": "UP",
            "PriorityTier": "1",
            "GraceTime": "5",
            "PreemptMode": "REQUEUE",
        },
        "infer": {"Nodes": "ALL", "MaxTime": "INFINITE", "State": "UP", "PriorityTier": "10", "PreemptMode": "OFF"},
    }


def test_cgroup_conf_by_version() -> None:
    assert render_cgroup_conf(V2205) is None
    for version in (SlurmVersion(24, 5, 0), V2411, SlurmVersion(25, 5, 1)):
        text = render_cgroup_conf(version)
        assert text is not None
        assert "CgroupPlugin=disabled" in text.splitlines()
    text_23 = render_cgroup_conf(SlurmVersion(23, 11, 4))
    assert text_23 is not None and "IgnoreSystemd=yes" in text_23


def test_rendering_is_pure() -> None:
    conf = ClusterConf(state_dir=STATE, version=V2411, hooks=Hooks(prolog=Path("/h/prolog")))
    assert render_slurm_conf(conf) == render_slurm_conf(conf)
    assert render_cgroup_conf(V2411) == render_cgroup_conf(V2411)


def test_relative_state_dir_is_refused() -> None:
    with pytest.raises(SlurmError, match="absolute"):
        render_slurm_conf(ClusterConf(state_dir=Path(".cluster"), version=V2205))


def test_all_hooks() -> None:
    hooks = Hooks(
        prolog=Path("/h/prolog"),
        epilog=Path("/h/epilog"),
        healthcheck=Path("/h/healthcheck"),
        prolog_slurmctld=Path("/h/prolog_slurmctld"),
        epilog_slurmctld=Path("/h/epilog_slurmctld"),
        healthcheck_interval_s=15,
        timeout_s=40,
    )
    s = settings(render_slurm_conf(ClusterConf(state_dir=STATE, version=V2205, hooks=hooks)))
    assert {k: s[k] for k in HOOK_KEYS if k in s} == {
        "Prolog": "/h/prolog",
        "Epilog": "/h/epilog",
        "PrologSlurmctld": "/h/prolog_slurmctld",
        "EpilogSlurmctld": "/h/epilog_slurmctld",
        "PrologFlags": "Alloc",
        "PrologEpilogTimeout": "40",
        "HealthCheckProgram": "/h/healthcheck",
        "HealthCheckInterval": "15",
    }


def test_only_present_hooks() -> None:
    hooks = Hooks(epilog=Path("/h/epilog"))
    s = settings(render_slurm_conf(ClusterConf(state_dir=STATE, version=V2411, hooks=hooks)))
    assert s["Epilog"] == "/h/epilog"
    assert s["PrologFlags"] == "Alloc"
    assert s["PrologEpilogTimeout"] == "60"
    assert not {"Prolog", "HealthCheckProgram", "HealthCheckInterval", "PrologSlurmctld", "EpilogSlurmctld"} & set(s)


def test_hook_timeout_split_from_25_05() -> None:
    hooks = Hooks(prolog=Path("/h/prolog"))
    s = settings(render_slurm_conf(ClusterConf(state_dir=STATE, version=SlurmVersion(25, 5, 0), hooks=hooks)))
    assert s["PrologTimeout"] == s["EpilogTimeout"] == "60"
    assert "PrologEpilogTimeout" not in s


def _write_hook(path: Path, executable: bool = True) -> None:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(stat.S_IRWXU if executable else stat.S_IRUSR | stat.S_IWUSR)


def test_hooks_from_dir_takes_only_present_files(tmp_path: Path) -> None:
    _write_hook(tmp_path / "prolog")
    _write_hook(tmp_path / "healthcheck")
    (tmp_path / "README").write_text("not a hook")
    hooks = Hooks.from_dir(tmp_path, healthcheck_interval_s=7)
    assert hooks.prolog == tmp_path / "prolog"
    assert hooks.healthcheck == tmp_path / "healthcheck"
    assert hooks.epilog is None and hooks.prolog_slurmctld is None and hooks.epilog_slurmctld is None
    assert hooks.healthcheck_interval_s == 7
    assert hooks.any()


def test_hooks_from_dir_all_names(tmp_path: Path) -> None:
    for name in HOOK_NAMES:
        _write_hook(tmp_path / name)
    hooks = Hooks.from_dir(tmp_path)
    assert all(getattr(hooks, attr) == tmp_path / name for name, attr in HOOK_NAMES.items())


def test_hooks_from_empty_dir(tmp_path: Path) -> None:
    hooks = Hooks.from_dir(tmp_path)
    assert not hooks.any()
    assert "Prolog" not in render_slurm_conf(ClusterConf(state_dir=STATE, version=V2205, hooks=hooks))


def test_hooks_must_be_executable(tmp_path: Path) -> None:
    _write_hook(tmp_path / "epilog", executable=False)
    with pytest.raises(SlurmError, match="not an executable"):
        Hooks.from_dir(tmp_path)


def test_hooks_dir_must_exist(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="does not exist"):
        Hooks.from_dir(tmp_path / "missing")
