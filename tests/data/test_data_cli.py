from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.data import cli
from slurm_elastic.data.__main__ import main


def test_prepare_data_summary(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["prepare-data", "--source", str(corpus), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith(f"prepared {out}: 3 files (0 skipped)") and stdout.count("\n") == 1
    assert (out / "tokens.bin").is_file()


def test_prepare_data_json_and_options(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["prepare-data", "--source", str(corpus), "--pattern", "*.txt", "--out", str(out), "--json"]
    assert main([*argv, "--max-mb", "0.000005"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == 1 and report["bytes"] == 5 and report["tokens_path"] == str(out / "tokens.bin")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--source", "/no/such/dir"], "slurm-elastic: error: source '/no/such/dir' does not exist\n"),
        (["--max-mb", "0"], "slurm-elastic: error: --max-mb must be > 0, got 0.0\n"),
    ],
)
def test_errors_are_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prepare-data", "--out", str(tmp_path / "o"), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == message and captured.out == ""


def test_mounts_into_another_parser(corpus: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="slurm-elastic")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["prepare-data", "--source", str(corpus), "--out", str(tmp_path / "o")])
    assert args.func is cli.run and args.sources == [str(corpus)] and args.max_mb is None


def test_python_dash_m(corpus: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_elastic.data", "prepare-data", "--source", str(corpus), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("prepared")


def test_cli_does_not_import_torch() -> None:
    # The prepare-data command and the order arithmetic must not pay torch's ~1.5 s import.
    code = "import sys, slurm_elastic.data.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"
