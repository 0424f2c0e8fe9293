"""The sample ledger: which stream positions each committed step consumed, to prove exactly-once data.

Workers append two kinds of record to one file each (unbuffered, so a SIGKILL loses nothing written):
a contribution `{"run", "g", "s", "w", "p": [[start, end], ...]}` before a step's reduction, and a
commit `{"run", "g", "c": step, "cur": cursor}` after it. A step's samples are the contributions of the
generation that committed it (in the latest run, for a job resumed from a checkpoint). Checking them
against the committed cursor finds any sample consumed twice or skipped.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slurm_elastic.errors import ElasticError

ENV_VAR = "SLURM_ELASTIC_LEDGER_DIR"


class LedgerError(ElasticError):
    """A ledger record could not be written whole."""


class LedgerWriter:
    def __init__(self, directory: Path, worker_id: str, run: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", worker_id)
        self.path = directory / f"{safe}.jsonl"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        end = os.fstat(self._fd).st_size
        if end and os.pread(self._fd, 1, end - 1) != b"\n":
            os.write(self._fd, b"\n")  # end a line torn by a SIGKILL in an earlier run of this worker id
        self._run = run
        self._worker = worker_id

    def _write(self, record: dict[str, object], *, sync: bool = False) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                written = os.write(self._fd, data)
                if written <= 0:
                    raise LedgerError(f"ledger {self.path}: a write of {len(data)} bytes wrote nothing")
                data = data[written:]  # a short write is finished, never left as a gap
            if sync:
                os.fsync(self._fd)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path}: {exc.strerror or exc}") from exc

    def contribute(self, generation: int, step: int, ranges: list[tuple[int, int]]) -> None:
        self._write({"run": self._run, "g": generation, "s": step, "w": self._worker, "p": ranges})

    def commit(self, generation: int, step: int, cursor: int) -> None:
        """The step's commit record, on disk (fsynced) before the next step starts."""
        self._write({"run": self._run, "g": generation, "c": step, "cur": cursor}, sync=True)

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class LedgerReport:
    committed_steps: int
    final_cursor: int
    samples_consumed: int
    duplicate_samples: int
    skipped_samples: int
    steps_committed_twice: int


def _records(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line torn by SIGKILL mid-write carries no commit
    return out


def analyze(directory: str | os.PathLike[str]) -> LedgerReport:
    """What a job's ledger directory says about its samples: each step committed once, each sample seen once."""
    records = _records(Path(directory))
    commits: dict[int, set[tuple[int, int]]] = defaultdict(set)
    cursor_at: dict[tuple[int, int], int] = {}
    contributions: dict[tuple[int, int, int], dict[str, list[list[int]]]] = defaultdict(dict)
    for r in records:
        run, gen = int(r["run"]), int(r["g"])  # type: ignore[call-overload]
        if "c" in r:
            step = int(r["c"])  # type: ignore[call-overload]
            commits[step].add((run, gen))
            cursor_at[(run, step)] = int(r["cur"])  # type: ignore[call-overload]
        else:
            key = (run, gen, int(r["s"]))  # type: ignore[call-overload]
            contributions[key][str(r["w"])] = r["p"]  # type: ignore[assignment]
    if not commits:
        return LedgerReport(0, 0, 0, 0, 0, 0)
    last_run = max(run for gens in commits.values() for run, _ in gens)
    final_step = max(step for step, gens in commits.items() if any(run == last_run for run, _ in gens))
    final_cursor = cursor_at[(last_run, final_step)]
    counts = np.zeros(final_cursor, dtype=np.int64)
    extra = twice = 0
    for step in range(1, final_step + 1):
        gens = commits.get(step, set())
        if not gens:
            continue
        newest_run = max(run for run, _ in gens)
        committing = sorted(g for run, g in gens if run == newest_run)
        twice += len(committing) - 1
        for gen in committing:
            for ranges in contributions.get((newest_run, gen, step), {}).values():
                for start, end in ranges:
                    inside_end = min(end, final_cursor)
                    if start < inside_end:
                        counts[start:inside_end] += 1
                    extra += max(0, end - max(start, final_cursor))
    duplicates = int(np.clip(counts - 1, 0, None).sum()) + extra
    skipped = int((counts == 0).sum())
    return LedgerReport(final_step, final_cursor, int(counts.sum()) + extra, duplicates, skipped, twice)
