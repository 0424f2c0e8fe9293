"""Submit elastic training jobs to the local Slurm cluster and watch them through their events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.data import default_corpus, prepare_data
from slurm_elastic.eventtypes import E, MembershipChange, Progress, of_kind
from slurm_elastic.jobdir import job_dir
from slurm_elastic.ledger import LedgerReport, analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.slurm import CliBackend, JobInfo
from slurm_elastic.waiting import WaitTimedOut, wait_until

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "sbatch_templates" / "elastic_core.sbatch"
SLOW = REPO / "tests" / "integration" / "train_slow.py"
TOLERANCE = 1e-6  # exact mode: the same bits as the uninterrupted run whatever happens to the job
EXACT = {"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}


def corpus(root: Path) -> Path:
    out = root / "corpus"
    if not (out / "meta.json").exists():
        prepare_data(default_corpus(), out, max_bytes=1_000_000)
    return out


def reference_model(root: Path, steps: int) -> dict[str, torch.Tensor]:
    """The uninterrupted run: the same script alone (world size never changes the result)."""
    out = root / f"reference-{steps}.pt"
    if not out.exists():
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {"OMP_NUM_THREADS": "1", **EXACT}
        cmd = [sys.executable, str(SLOW), "--data", str(corpus(root)), "--steps", str(steps), "--save", str(out)]
        subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)
    return torch.load(out)  # type: ignore[no-any-return]


@dataclass
class ElasticSlurmJob:
    job_id: str
    root: Path
    steps: int
    backend: CliBackend = field(default_factory=CliBackend)

    @property
    def dir(self) -> Path:
        return job_dir(self.job_id, self.root / "home")

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.dir / "events.jsonl"
        if not path.exists():
            return []
        out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [e for e in out if kind is None or e["event"] == kind]

    def of(self, kind: type[E]) -> list[E]:
        """The job's events of one catalogued kind, as its type."""
        return of_kind(self.events(), kind)

    def worlds(self) -> list[int]:
        """The world size of each generation, in order."""
        return [e.world for e in self.of(MembershipChange)]

    def last_step(self) -> int:
        return max((e.step for e in self.of(Progress)), default=0)

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 180.0) -> None:
        try:
            wait_until(predicate, timeout=timeout, what=f"{what} (job {self.job_id})", poll=0.2)
        except WaitTimedOut as exc:
            raise AssertionError(f"{exc}; output:\n{self.output()[-3000:]}") from None

    def wait_step(self, step: int, timeout: float = 180.0) -> None:
        self.wait(f"step {step}", lambda: self.last_step() >= step, timeout)

    def info(self) -> JobInfo:
        return self.backend.job(self.job_id)

    def hurry(self) -> None:
        """Drop the pause between steps from now on: the test has seen what needed the job to run slowly."""
        pace = self.root / "pause"
        pace.with_suffix(".tmp").write_text("0")
        pace.with_suffix(".tmp").replace(pace)

    def wait_finished(self, timeout: float = 300.0, *, hurry: bool = True) -> JobInfo:
        if hurry:
            self.hurry()
        self.wait("the job to end", lambda: self.info().is_finished and self.info().state != "REQUEUED", timeout)
        return self.info()

    def output(self) -> str:
        files = sorted(self.root.glob(f"*-{self.job_id}.out"))
        return "\n".join(p.read_text(errors="replace") for p in files)

    def ledger(self) -> LedgerReport:
        return analyze(self.root / "ledger")

    def assert_same_training(self, reference: dict[str, torch.Tensor]) -> None:
        assert self.model.exists(), f"no model written; output:\n{self.output()[-3000:]}"
        assert max_param_rel_diff(torch.load(self.model), reference) <= TOLERANCE
        report = self.ledger()
        assert (report.committed_steps, report.duplicate_samples, report.skipped_samples) == (self.steps, 0, 0), report

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], check=False, timeout=30)


def job_env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SLURM_ELASTIC_HOME": str(root / "home"),
        "SLURM_ELASTIC_LEDGER_DIR": str(root / "ledger"),
        "SLURM_ELASTIC_HEARTBEAT_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_LEASE_TIMEOUT_S": "5",
        "SLURM_ELASTIC_PROGRESS_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_NODE_WATCH_INTERVAL_S": "1",
        "SLURM_ELASTIC_CHECKPOINT_EVERY": "10",
        "SLURM_ELASTIC_MAX_RESTARTS": "0",
        **EXACT,
        "OMP_NUM_THREADS": "1",
        "SE_PYTHON": sys.executable,
    }


def submit_core(
    root: Path,
    *,
    nodes: str | None,
    steps: int,
    pause: float,
    sbatch_args: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    template: Path = CORE,
    command: Sequence[str] | None = None,
) -> ElasticSlurmJob:
    """Submit `template` running `command` (by default train_slow.py for `steps` steps, `pause` s apart)."""
    root.mkdir(parents=True, exist_ok=True)
    if command is None:
        command = [
            sys.executable, str(SLOW), "--data", str(corpus(root.parent)), "--steps", str(steps),
            "--pause", str(pause), "--pause-file", str(root / "pause"), "--save", str(root / "model.pt"),
        ]  # fmt: skip
    argv = [
        "sbatch", "--parsable", *([f"--nodes={nodes}"] if nodes else []), f"--chdir={root}",
        f"--output={root}/core-%j.out", *sbatch_args, str(template), *command,
    ]  # fmt: skip
    # Settings go in sbatch's own environment: for SLURM_* names Slurm lets that win over --export=NAME=value.
    settings = {**job_env(root), **(env or {})}
    job_id = subprocess.run(argv, env=settings, check=True, capture_output=True, text=True, timeout=30).stdout
    return ElasticSlurmJob(job_id.strip().split(";")[0], root, steps)
