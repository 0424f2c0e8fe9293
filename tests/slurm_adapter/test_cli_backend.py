from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_adapter.slurm_fixtures import fixture_text
from slurm_elastic.slurm.cli_backend import CliBackend, CommandResult, run_command
from slurm_elastic.slurm.errors import JobNotFound, SlurmCommandError, SlurmRequestError, SlurmTimeout
from slurm_elastic.slurm.records import SlurmVersion


class Script:
    """A runner that answers argv prefixes with canned results and records every call."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], dict[str, str], float]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CommandResult:
        self.calls.append((list(argv), dict(env), timeout))
        for prefix, result in sorted(self.answers.items(), key=lambda kv: -len(kv[0])):
            if tuple(argv[: len(prefix)]) == prefix:
                return result
        raise AssertionError(f"unexpected command {argv}")


def ok(stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(0, stdout, stderr)


def backend(answers: dict[tuple[str, ...], CommandResult], **kw: object) -> tuple[CliBackend, Script]:
    script = Script(answers)
    return CliBackend(runner=script, **kw), script  # type: ignore[arg-type]


def test_version_is_read_once() -> None:
    cli, script = backend({("scontrol", "--version"): ok(fixture_text("22.05/doc_version.txt"))})
    assert cli.version() == SlurmVersion(22, 5, 8)
    assert cli.version() == SlurmVersion(22, 5, 8)
    assert len(script.calls) == 1


def test_22_05_uses_text_scontrol_and_squeue_json_filtered_client_side() -> None:
    cli, script = backend(
        {
            ("scontrol", "--version"): ok("slurm 22.05.8\n"),
            ("scontrol", "show", "job", "-o"): ok(fixture_text("22.05/doc_scontrol_show_job_o.txt")),
            ("scontrol", "show", "node", "-o"): ok(fixture_text("22.05/doc_scontrol_show_node_o.txt")),
            ("squeue", "--json"): ok(fixture_text("22.05/doc_squeue_json.json")),
        }
    )
    assert cli.job("24").state == "COMPLETING"
    assert [j.job_id for j in cli.jobs(name="satellite")] == ["22"]
    assert [j.job_id for j in cli.jobs(states=["pending"])] == ["22", "23"]
    assert [j.job_id for j in cli.jobs(user="bob")] == []
    assert [n.name for n in cli.nodes(["n3", "n4"])] == ["n3", "n4"]
    argvs = [c[0] for c in script.calls]
    assert ["scontrol", "show", "job", "-o", "24"] in argvs
    assert ["scontrol", "show", "node", "-o", "n[3-4]"] in argvs
    assert ["squeue", "--json", "--all", "--states=all", "--name=satellite"] in argvs


def test_24_11_uses_scontrol_json() -> None:
    cli, script = backend(
        {
            ("scontrol", "--json", "show", "job"): ok(fixture_text("24.11/doc_scontrol_show_job_json.json")),
            ("scontrol", "--json", "show", "node"): ok(fixture_text("24.11/doc_scontrol_show_node_json.json")),
        },
        version=SlurmVersion(24, 11, 1),
    )
    assert cli.job("101").nodes == ("n1", "n2", "n3", "n4")
    assert {n.name for n in cli.nodes() if n.drain} == {"n3"}
    assert script.calls[0][0] == ["scontrol", "--json", "show", "job", "101"]


@pytest.mark.parametrize("version", [SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 1)])
def test_unknown_job_raises_job_not_found(version: SlurmVersion) -> None:
    gone = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
    cli, _ = backend({("scontrol",): gone}, version=version)
    with pytest.raises(JobNotFound, match="'77'"):
        cli.job("77")


@pytest.mark.parametrize("rc", [0, 1])
def test_json_error_document_for_unknown_job(rc: int) -> None:
    text = fixture_text("24.11/doc_scontrol_show_job_json_missing.json")
    cli, _ = backend({("scontrol",): CommandResult(rc, text, "")}, version=SlurmVersion(24, 11, 1))
    with pytest.raises(JobNotFound):
        cli.job("999")


def test_failure_names_command_and_first_stderr_line() -> None:
    err = CommandResult(1, "", "\nscontrol: error: Unable to contact slurm controller (connect failure)\nmore\n")
    cli, _ = backend({("scontrol",): err}, version=SlurmVersion(22, 5, 8))
    with pytest.raises(SlurmCommandError) as info:
        cli.nodes()
    assert str(info.value) == (
        "`scontrol show node -o` exited 1: scontrol: error: Unable to contact slurm controller (connect failure)"
    )


def test_submit_passes_options_env_and_parses_id(tmp_path: Path) -> None:
    job = tmp_path / "job.sbatch"
    job.write_text("#!/bin/bash\nsleep 1\n")
    cli, script = backend({("sbatch",): ok("123;elastic\n")}, env={"SLURM_CONF": "/etc/x.conf"})
    assert cli.submit(job, args=["--nodes=2"], env={"FOO": "1"}) == "123"
    argv, env, timeout = script.calls[0]
    assert argv == ["sbatch", "--parsable", "--nodes=2", str(job)]
    assert env["SLURM_CONF"] == "/etc/x.conf" and env["FOO"] == "1" and "PATH" in env
    assert timeout == 30.0


def test_submit_test_only_reads_stderr(tmp_path: Path) -> None:
    job = tmp_path / "job.sbatch"
    job.write_text("#!/bin/bash\n")
    cli, script = backend({("sbatch",): ok("", fixture_text("22.05/doc_sbatch_test_only.txt"))})
    assert cli.submit(job, test_only=True) == "29"
    assert script.calls[0][0][:3] == ["sbatch", "--parsable", "--test-only"]
    failing = CommandResult(1, "", fixture_text("22.05/doc_sbatch_test_only_error.txt"))
    cli, _ = backend({("sbatch",): failing})
    with pytest.raises(SlurmCommandError, match="allocation failure"):
        cli.submit(job, test_only=True)


def test_submit_missing_script() -> None:
    cli, _ = backend({})
    with pytest.raises(SlurmRequestError, match="does not exist"):
        cli.submit(Path("/nonexistent/job.sbatch"))


def test_action_argvs() -> None:
    cli, script = backend({("scancel",): ok(), ("scontrol",): ok()})
    cli.cancel("5")
    cli.cancel("5", signal="TERM", batch_only=True)
    cli.requeue("5")
    cli.resize_job("5", num_nodes=2)
    cli.resize_job("5", nodelist=["n1", "n2"])
    cli.set_node_state(["n3", "n4"], "drain", "reclaim for inference")
    cli.set_node_state("n3", "RESUME", "")
    assert [c[0] for c in script.calls] == [
        ["scancel", "5"],
        ["scancel", "--signal=TERM", "--batch", "5"],
        ["scontrol", "requeue", "5"],
        ["scontrol", "update", "JobId=5", "NumNodes=2"],
        ["scontrol", "update", "JobId=5", "NodeList=n[1-2]"],
        ["scontrol", "update", "NodeName=n[3-4]", "State=DRAIN", "Reason=reclaim for inference"],
        ["scontrol", "update", "NodeName=n3", "State=RESUME"],
    ]


def test_cancel_of_finished_job_is_quiet_and_of_unknown_job_raises() -> None:
    done = CommandResult(
        0, "", "scancel: error: Kill job error on job id 5: Job/step already completing or completed\n"
    )
    cli, _ = backend({("scancel",): done})
    cli.cancel("5")
    gone = CommandResult(1, "", "scancel: error: Invalid job id 6\n")
    cli, _ = backend({("scancel",): gone})
    with pytest.raises(JobNotFound):
        cli.cancel("6")


class Sequenced(Script):
    """A runner whose answers to one command change from call to call."""

    def __init__(self, results: list[CommandResult]) -> None:
        super().__init__({})
        self.results = results

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CommandResult:
        self.calls.append((list(argv), dict(env), timeout))
        return self.results[min(len(self.calls), len(self.results)) - 1]


def test_a_job_update_slurm_asks_to_retry_is_retried_a_bounded_number_of_times() -> None:
    busy = CommandResult(1, "", "Job update not available right now, the DB index is being set, try again in a bit")
    script = Sequenced([busy, busy, ok()])
    cli = CliBackend(runner=script, retry_delays=(0, 0, 0))
    cli.resize_job("23", num_nodes=2)
    assert [c[0] for c in script.calls] == [["scontrol", "update", "JobId=23", "NumNodes=2"]] * 3
    always = Sequenced([busy])
    with pytest.raises(SlurmCommandError, match="try again"):
        CliBackend(runner=always, retry_delays=(0, 0)).resize_job("23", num_nodes=2)
    assert len(always.calls) == 3  # the first try and one per delay
    other = Sequenced([CommandResult(1, "", "scontrol: error: Invalid node count")])
    with pytest.raises(SlurmCommandError):
        CliBackend(runner=other, retry_delays=(0, 0)).resize_job("23", num_nodes=2)
    assert len(other.calls) == 1  # other errors are not retried


def test_request_errors() -> None:
    cli, _ = backend({})
    with pytest.raises(SlurmRequestError, match="not one of"):
        cli.set_node_state("n1", "SLEEP", "x")
    with pytest.raises(SlurmRequestError, match="needs a non-empty reason"):
        cli.set_node_state("n1", "DRAIN", " ")
    with pytest.raises(SlurmRequestError, match="num_nodes or nodelist"):
        cli.resize_job("5")
    with pytest.raises(SlurmRequestError, match="at least 1"):
        cli.resize_job("5", num_nodes=0)
    with pytest.raises(SlurmRequestError, match="positive"):
        CliBackend(timeout=0)


def test_bin_dir_and_hostnames(tmp_path: Path) -> None:
    cli, script = backend({(str(tmp_path / "scontrol"),): ok("slurm 24.11.1")}, bin_dir=tmp_path)
    assert cli.version() == SlurmVersion(24, 11, 1)
    assert cli.hostnames("n[1-2]") == ["n1", "n2"]
    assert script.calls[0][0] == [str(tmp_path / "scontrol"), "--version"]


def test_run_command_real_processes() -> None:
    assert run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], {"PATH": "/usr/bin:/bin"}, 5) == (
        CommandResult(3, "out\n", "err\n")
    )
    with pytest.raises(SlurmTimeout, match=r"timed out after 0\.2 s"):
        run_command(["sleep", "5"], {"PATH": "/usr/bin:/bin"}, 0.2)
    with pytest.raises(SlurmCommandError, match="could not start") as refused:
        run_command(["/nonexistent/scontrol"], {}, 5)
    assert not isinstance(refused.value, SlurmTimeout)  # not worth asking again
