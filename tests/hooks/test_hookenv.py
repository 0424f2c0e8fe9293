"""Parsing Slurm's hook environment: what 22.05 really sets, and hostile values from the job's user."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from slurm_elastic.hooks.hookenv import (
    HookInputError,
    handle_path_from_comment,
    job_env,
    parse_job_id,
    parse_node_name,
    parse_nodelist,
    parse_uid,
    this_node,
)

# Seen on this machine (Slurm 22.05.8): the Epilog of a node released by `scontrol update NumNodes=2`.
EPILOG_2205 = {
    "SLURMD_NODENAME": "n3",
    "SLURM_CLUSTER_NAME": "elastic",
    "SLURM_CONF": "/work/main/.cluster/slurm.conf",
    "SLURM_JOBID": "1",
    "SLURM_JOB_COMMENT": "slurm-elastic:/tmp/updated",
    "SLURM_JOB_CPUS_PER_NODE": "1(x4)",
    "SLURM_JOB_GID": "0",
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_JOB_UID": "0",
    "SLURM_JOB_USER": "root",
    "SLURM_NODELIST": "n[3-4]",
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
    "SLURM_UID": "0",
}
# The same job's EpilogSlurmctld: no SLURMD_NODENAME, SLURM_JOB_NODELIST, and the job name (user text).
EPILOG_SLURMCTLD_2205 = {
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_UID": "0",
    "SLURM_JOB_NAME": 'evil $(id) `x` "q" ; name',
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_COMMENT": "slurm-elastic:/tmp/updated",
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
}

HOSTILE = [
    "",
    " 1",
    "1 ",
    "1;reboot",
    "$(id)",
    "`id`",
    "1\n2",
    "1'",
    '1"',
    "../1",
    "1\x00",
    "-1",
    "١٢",  # Arabic-Indic digits: str.isdigit() says yes, a job id says no
]


def test_epilog_env_of_a_shrink() -> None:
    env = job_env(EPILOG_2205, on_node=True)
    assert (env.job_id, env.uid, env.node, env.nodes) == ("1", 0, "n3", ("n3", "n4"))
    assert env.comment == "slurm-elastic:/tmp/updated"
    assert env.context == "epilog_slurmd"


def test_slurmctld_env_has_no_node_and_ignores_the_job_name() -> None:
    env = job_env(EPILOG_SLURMCTLD_2205, on_node=False)
    assert env.node is None
    assert env.nodes == ("n1", "n2")


@pytest.mark.parametrize("value", [*HOSTILE, "12345678901", None])
def test_hostile_job_ids_are_refused(value: str | None) -> None:
    with pytest.raises(HookInputError, match="SLURM_JOB_ID"):
        parse_job_id(value)


@pytest.mark.parametrize("value", [*HOSTILE, "4294967295", None])
def test_hostile_uids_are_refused(value: str | None) -> None:
    with pytest.raises(HookInputError, match="SLURM_JOB_UID"):
        parse_uid(value)


@pytest.mark.parametrize("value", [*HOSTILE, "n[1-2]", "n 3", ".hidden", "a" * 101, "n3/../etc"])
def test_hostile_node_names_are_refused(value: str) -> None:
    with pytest.raises(HookInputError) as info:
        parse_node_name(value)
    assert "\n" not in str(info.value)  # quoted with !r: a newline cannot forge a second log line


def test_node_names_slurm_allows() -> None:
    for name in ("n1", "gpu-a100-07", "node_3", "r1.n2"):
        assert parse_node_name(name) == name


@pytest.mark.parametrize("value", ["n[1-2],$(id)", "n1,`x`", "n1;n2", "n[1-3", "n1 n2", "n1\nn2", "../n1"])
def test_hostile_nodelists_are_refused(value: str) -> None:
    with pytest.raises(HookInputError):
        parse_nodelist(value)


def test_nodelist_expands() -> None:
    assert parse_nodelist("n[1-2],gpu07") == ("n1", "n2", "gpu07")
    assert parse_nodelist("") == () and parse_nodelist(None) == ()


def test_missing_node_on_a_node_hook() -> None:
    env = dict(EPILOG_2205)
    del env["SLURMD_NODENAME"]
    with pytest.raises(HookInputError, match="SLURMD_NODENAME=None"):
        job_env(env, on_node=True)


def test_strange_script_context_is_neutralised() -> None:
    env = job_env({**EPILOG_2205, "SLURM_SCRIPT_CONTEXT": "x\nforged line"}, on_node=True)
    assert env.context == "?"


def test_healthcheck_node() -> None:
    assert this_node({"SLURMD_NODENAME": "n2"}) == "n2"
    with pytest.raises(HookInputError):
        this_node({"SLURMD_NODENAME": "n2; rm -rf /"})


# --- the comment and the path inside it -----------------------------------------------------------------


@pytest.mark.parametrize("comment", [None, "", "training run 7", "slurm-elastic", "SLURM-ELASTIC:/a/coordinator.json"])
def test_other_comments_are_not_elastic(comment: str | None) -> None:
    assert handle_path_from_comment(comment) is None


@pytest.mark.parametrize(
    "path",
    [
        "/home/a b/.slurm-elastic/jobs/7/coordinator.json",
        "/home/$(reboot)/coordinator.json",
        "/home/`id`/coordinator.json",
        '/home/it\'s "quoted"; ls/coordinator.json',
        "/tmp/é/coordinator.json",
    ],
)
def test_odd_but_harmless_paths_are_kept_literally(path: str) -> None:
    # These characters mean nothing to open(2); the hooks never hand the path to a shell.
    assert handle_path_from_comment(f"slurm-elastic:{path}") == PurePosixPath(path)


def test_padding_around_the_comment_is_ignored() -> None:
    # `scontrol show job -o` pads the comment with a blank.
    assert handle_path_from_comment("slurm-elastic:/j/coordinator.json  ") == PurePosixPath("/j/coordinator.json")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "names no path"),
        ("relative/coordinator.json", "absolute"),
        ("~/coordinator.json", "absolute"),
        ("/a/../etc/coordinator.json", "normalised"),
        ("/a/./coordinator.json", "normalised"),
        ("//a/coordinator.json", "normalised"),
        ("/a//coordinator.json", "normalised"),
        ("/a/coordinator.json/", "normalised"),
        ("/a/coordinator.json\n/etc/shadow", "control character"),
        ("/a/coord\x1b[2Jinator.json", "control character"),
        ("/a/coordinator.json\x00", "control character"),
        ("/etc/shadow", "must name coordinator.json"),
        ("/a/coordinator.json.bak", "must name coordinator.json"),
        ("/" + "a" * 5000 + "/coordinator.json", "characters long"),
    ],
)
def test_bad_paths_are_refused(path: str, why: str) -> None:
    with pytest.raises(HookInputError, match=why) as info:
        handle_path_from_comment(f"slurm-elastic:{path}")
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
