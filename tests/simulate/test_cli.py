"""`slurm-elastic simulate` as a user runs it: our figures from the benchmarks' JSON files (a missing or bad
one named, with the command that writes it), the scenario from flags (a bad value named), one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_elastic.cli import main


def _bench(directory: Path, **overrides: object) -> Path:
    files = {
        "mttr.json": {"elastic_mttr_s_median": 0.08, "elastic_join_s_median": 3.2, "baseline_mttr_s_median": 4.5},
        "mttr-slurm.json": {"elastic_mttr_s_median": 0.9, "baseline_mttr_s_median": 21.0},
        "overhead.json": {"max_ratio_fast": 1.02},
    }
    for name, data in files.items():
        (directory / name).write_text(json.dumps({**data, **overrides.get(name, {})}))  # type: ignore[dict-item]
    return directory


def test_prints_goodput_per_strategy_from_the_measured_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--inputs", str(_bench(tmp_path)), "--gpus", "16384", "--runs", "2", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["gpus"], out["days"], out["runs"]) == (16384, 30.0, 2)
    assert set(out["strategies"]) == {"checkpoint_restart", "checkpointless", "elastic"}
    for s in out["strategies"].values():
        assert 0.0 < s["goodput"] <= 1.0 and s["wasted_gpu_hours"] >= 0 and s["lost_steps"] >= 0
    assert out["measured"]["requeue_s"] == 21.0 and out["measured"]["step_ratio"] == 1.02
    assert out["measured"]["sources"]["join_s"].endswith("mttr.json:elastic_join_s_median")
    assert out["measured"]["sources"]["join_s"].startswith("/")  # outside the working directory: as given
    # the target of issue 25 at 16,384 GPUs and the Llama 3 rate, with these figures
    strategies = out["strategies"]
    assert strategies["elastic"]["goodput"] >= 0.97 > strategies["checkpoint_restart"]["goodput"]


def test_sources_inside_the_working_directory_are_recorded_relative_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bench").mkdir()
    _bench(tmp_path / "bench")
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--inputs", str(tmp_path / "bench"), "--gpus", "64", "--runs", "1", "--json"]) == 0
    sources = json.loads(capsys.readouterr().out)["measured"]["sources"]
    assert sources["join_s"] == "bench/mttr.json:elastic_join_s_median", sources


def test_a_missing_file_names_itself_and_the_command_that_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (_bench(tmp_path) / "mttr-slurm.json").unlink()
    assert main(["simulate", "--inputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "mttr-slurm.json is missing" in err and "bench mttr --slurm --json" in err


def test_a_figure_that_is_not_a_positive_number_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _bench(tmp_path, **{"overhead.json": {"max_ratio_fast": None}})
    assert main(["simulate", "--inputs", str(tmp_path)]) == 2
    assert "max_ratio_fast=None is not a positive number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--gpus", "12"], "not a whole number of nodes"), (["--days", "-1"], "--days -1"), (["--runs", "0"], "--runs 0")],
)
def test_a_bad_scenario_is_one_line_naming_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    assert main(["simulate", "--inputs", str(_bench(tmp_path)), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and err.count("\n") == 0, err


def test_plot_draws_goodput_against_gpus_from_16_up_to_the_scenarios_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figure = tmp_path / "goodput.png"
    argv = ["simulate", "--inputs", str(_bench(tmp_path)), "--gpus", "4096", "--runs", "2", "--plot", str(figure)]
    assert main([*argv, "--json"]) == 0
    by_gpus = json.loads(capsys.readouterr().out)["by_gpus"]
    assert list(by_gpus) == ["16", "64", "256", "1024", "4096"]
    restart = [by_gpus[n]["checkpoint_restart"] for n in by_gpus]
    assert restart[-1] < restart[0]  # the job's failures grow with its size
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size < 200_000


def test_the_repositorys_own_benchmark_files_feed_the_default_run() -> None:
    from slurm_elastic.commands.simulate import REPO_BENCH
    from slurm_elastic.simulate.inputs import INPUTS, read_measured

    measured = read_measured(REPO_BENCH)
    assert set(measured.sources) == set(INPUTS)
    assert measured.mttr_s < measured.requeue_s  # what the figures are about
