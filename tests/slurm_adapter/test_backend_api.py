from __future__ import annotations

import pytest

import slurm_elastic.slurm as slurm
from slurm_elastic.errors import ConfigError
from slurm_elastic.slurm import CliBackend, SlurmBackend, get_backend, srun_argv
from slurm_elastic.slurm.errors import SlurmRequestError
from slurm_elastic.testing.fakeslurm import FakeSlurm


def test_srun_argv_defaults_keep_survivors_alive() -> None:
    assert srun_argv(["python", "-m", "agent"], nodes=4) == [
        "srun",
        "--no-kill",
        "--kill-on-bad-exit=0",
        "--ntasks-per-node=1",
        "--nodes=4",
        "python",
        "-m",
        "agent",
    ]


def test_srun_argv_options() -> None:
    argv = srun_argv(
        ["agent"],
        nodes=None,
        nodelist="n[1-2],n4",
        ntasks_per_node=2,
        no_kill=False,
        kill_on_bad_exit=1,
        extra=["--overlap"],
    )
    assert argv == [
        "srun", "--kill-on-bad-exit=1", "--ntasks-per-node=2", "--nodelist=n[1-2,4]", "--overlap", "agent"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"command": [], "nodes": 1}, "first word"),
        ({"command": ["--help"], "nodes": 1}, "first word"),
        ({"command": ["a"], "nodes": 0}, "at least 1"),
        ({"command": ["a"], "nodes": 1, "ntasks_per_node": 0}, "at least 1"),
        ({"command": ["a"], "nodes": 1, "nodelist": []}, "empty"),
    ],
)
def test_srun_argv_rejects(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(SlurmRequestError, match=match):
        srun_argv(**kwargs)  # type: ignore[arg-type]


def test_get_backend_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_ELASTIC_SLURM_BACKEND", raising=False)
    assert isinstance(get_backend("cli"), CliBackend)
    # pyslurm is not installed here: auto falls back to the CLI, an explicit request fails.
    assert isinstance(get_backend(), CliBackend)
    monkeypatch.setenv("SLURM_ELASTIC_SLURM_BACKEND", "cli")
    assert isinstance(get_backend(), CliBackend)
    with pytest.raises(ImportError):
        get_backend("pyslurm")


def test_get_backend_unknown_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_SLURM_BACKEND", "slurmrestd")
    with pytest.raises(ConfigError) as err:
        get_backend()
    message = str(err.value)
    assert "'slurmrestd'" in message and "auto, cli, pyslurm" in message and "\n" not in message


def test_backends_satisfy_the_protocol() -> None:
    assert isinstance(CliBackend(), SlurmBackend)
    assert isinstance(FakeSlurm(), SlurmBackend)


def test_small_public_surface() -> None:
    assert set(slurm.__all__) == {
        "CliBackend", "JobInfo", "JobNotFound", "NodeInfo", "SlurmBackend", "SlurmCommandError",
        "SlurmVersion", "compress_hostlist", "expand_hostlist", "get_backend", "srun_argv",
    }  # fmt: skip
