"""`bench report`: docs/benchmarks.md and its plots come from the benchmarks' own files, figure for figure;
a benchmark not run yet says which command writes its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")  # the `plots` extra, part of `dev`: the suite always has it

from slurm_elastic.showcase.bench.report import SOURCES, write_report

REPO_BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"


def _coordinator(agents: int, cpu: float, workers: int = 1) -> dict[str, object]:
    return {"agents": agents, "workers_per_agent": workers, "lease_s": 10.0, "heartbeat_s": 1.0,
            "detect_closed_p50_s": 0.01, "detect_closed_p99_s": 0.05 * agents / 256, "detect_silent_p50_s": 9.5,
            "detect_silent_p99_s": 10.2, "form_p50_s": 0.01, "form_p99_s": 0.2, "coordinator_cpu_fraction": cpu,
            "coordinator_rss_mb": 60.0, "frames_per_s": 4 * agents}  # fmt: skip


def test_the_report_quotes_each_file_and_draws_its_plot(tmp_path: Path) -> None:
    for name in ("mttr.json", "mttr-slurm.json", "overhead.json", "rendezvous.json"):
        shutil.copy(REPO_BENCH / name, tmp_path / name)
    (tmp_path / "coordinator-256.json").write_text(json.dumps(_coordinator(256, 0.031)))
    (tmp_path / "coordinator-4096.json").write_text(json.dumps(_coordinator(4096, 0.417)))
    (tmp_path / "coordinator-4096x8.json").write_text(json.dumps(_coordinator(4096, 0.444, workers=8)))
    chaos = {"seed": 3, "steps": 40, "lost_committed_steps": 0, "duplicate_samples": 0, "skipped_samples": 0,
             "max_param_rel_diff": 0.0, "tolerance": 1e-9, "reduce_dtype": "float64",
             "faults": [{"step": 10, "kind": "node_loss", "fired": True}, {"step": 20, "kind": "hang", "fired": False}],
             "losses": {"faulted": [[s, 4.0 - s / 20, 3] for s in range(1, 41)],
                        "reference": [[s, 4.0 - s / 20, 1] for s in range(1, 41)]}}  # fmt: skip
    (tmp_path / "chaos.json").write_text(json.dumps(chaos))
    out = write_report(tmp_path, tmp_path / "benchmarks.md")
    text = out.read_text()
    mttr = json.loads((REPO_BENCH / "mttr.json").read_text())
    assert f"| {mttr['elastic_mttr_s_median']} s | {mttr['baseline_mttr_s_median']} s | {mttr['ratio']} |" in text
    assert "| 4096 x 1 |" in text and "42%" in text and "| 256 x 1 |" in text and "3%" in text
    assert "| 4096 x 8 |" in text and "44%" in text and SOURCES["coordinator_wide"].command in text
    assert "1 faults (seed 3) over 40 steps" in text
    for plot in ("mttr.png", "overhead.png", "loss.png", "coordinator.png", "rendezvous.png"):
        assert (tmp_path / plot).stat().st_size > 5_000, plot
        assert f"(bench/{plot})" in text
    for key in ("notify", "simulate"):  # not run: the section names the command that writes the file
        assert f"Not run yet: `{SOURCES[key].command} > docs/bench/{SOURCES[key].file}`" in text
    assert SOURCES["overhead"].command in text  # each section says what wrote it


def test_the_repositorys_own_files_make_a_report(tmp_path: Path) -> None:
    """What `make bench` ends with, on the files kept in docs/bench."""
    for path in REPO_BENCH.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    text = write_report(tmp_path, tmp_path / "benchmarks.md").read_text()
    assert text.startswith("# Benchmarks") and "## Recovery after a node's SIGKILL" in text
