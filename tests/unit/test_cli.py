"""The command line: bad input gets one line naming the value and what is valid, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_elastic", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--recovery", "sometimes"),
            "invalid --recovery: 'sometimes' (input should be 'in_process', 'restart' or 'requeue')",
        ),
        (("--hang-timeout-s", "soon"), "invalid --hang-timeout-s: 'soon'"),
        (("--nodes", "0"), "invalid --nodes: '0' (input should be greater than or equal to 1)"),
    ],
)
def test_bad_setting_is_one_line_and_exit_code_2(args: tuple[str, ...], expected: str) -> None:
    done = cli("run", "--local", *args, "--", "true")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("slurm-elastic: error: ") and expected in lines[0]


def test_bad_environment_setting_names_the_variable() -> None:
    import os

    done = cli("run", "--local", "--", "true", env={**os.environ, "SLURM_ELASTIC_LOG_FORMAT": "xml"})
    assert done.returncode == 2
    assert "SLURM_ELASTIC_LOG_FORMAT: 'xml'" in done.stderr and "'console' or 'json'" in done.stderr


def test_missing_command() -> None:
    done = cli("run", "--local")
    assert done.returncode == 2 and "no training command" in done.stderr


def test_status_of_an_unknown_job(tmp_path: object) -> None:
    import os

    done = cli("status", "--job", "nope", env={**os.environ, "SLURM_ELASTIC_HOME": str(tmp_path)})
    assert done.returncode == 1
    assert "no job 'nope' under" in done.stderr and "Traceback" not in done.stderr
