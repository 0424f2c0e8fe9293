"""The sample ledger: analyze() on hand-written ledgers finds duplicates, gaps and double commits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_elastic.ledger import ENV_VAR, LedgerError, LedgerReport, LedgerWriter, analyze

STEP = 4  # samples per step; worker a takes the first half of each step, b the second


def contrib(run: int, g: int, s: int, w: str, ranges: list[list[int]]) -> dict[str, object]:
    return {"run": run, "g": g, "s": s, "w": w, "p": ranges}


def commit(run: int, g: int, s: int) -> dict[str, object]:
    return {"run": run, "g": g, "c": s, "cur": s * STEP}


def half(s: int, w: str) -> list[list[int]]:
    start = (s - 1) * STEP + (0 if w == "a" else STEP // 2)
    return [[start, start + STEP // 2]]


def clean_steps(run: int, g: int, steps: range, w: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for s in steps:
        out += [contrib(run, g, s, w, half(s, w)), commit(run, g, s)]
    return out


def write(directory: Path, worker: str, records: list[dict[str, object]], tail: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    with (directory / f"{worker}.jsonl").open("a") as f:
        f.write(lines + tail)


def test_empty_ledger(tmp_path: Path) -> None:
    assert analyze(tmp_path) == LedgerReport(0, 0, 0, 0, 0, 0)


def test_clean_run(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 4), "a"))
    write(tmp_path, "b", clean_steps(0, 1, range(1, 4), "b"))
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_a_path_given_as_a_string_reads_the_same(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 4), "a"))
    write(tmp_path, "b", clean_steps(0, 1, range(1, 4), "b"))
    assert analyze(str(tmp_path)) == analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_duplicated_contribution(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 4), "a"))
    b = clean_steps(0, 1, range(1, 4), "b")
    b[2] = contrib(0, 1, 2, "b", [[4, 6]])  # b re-reads a's half of step 2 and never its own
    write(tmp_path, "b", b)
    report = analyze(tmp_path)
    assert report == LedgerReport(3, 12, 12, duplicate_samples=2, skipped_samples=2, steps_committed_twice=0)


def test_skipped_range(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 4), "a"))
    b = clean_steps(0, 1, range(1, 4), "b")
    b[4] = contrib(0, 1, 3, "b", [[10, 11]])  # one sample of step 3 is never read
    write(tmp_path, "b", b)
    assert analyze(tmp_path) == LedgerReport(3, 12, 11, 0, 1, 0)


def test_read_past_the_cursor_counts_as_extra(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 3), "a"))
    b = clean_steps(0, 1, range(1, 3), "b")
    b[2] = contrib(0, 1, 2, "b", [[6, 10]])
    write(tmp_path, "b", b)
    assert analyze(tmp_path) == LedgerReport(2, 8, 10, 2, 0, 0)


def test_an_aborted_step_re_run_by_the_next_generation_counts_once(tmp_path: Path) -> None:
    # generation 1 contributes to step 3 but fails before the commit; generation 2 (only a left) re-runs it
    a = [*clean_steps(0, 1, range(1, 3), "a"), contrib(0, 1, 3, "a", half(3, "a"))]
    a += [contrib(0, 2, 3, "a", [[8, 12]]), commit(0, 2, 3)]
    write(tmp_path, "a", a)
    write(tmp_path, "b", [*clean_steps(0, 1, range(1, 3), "b"), contrib(0, 1, 3, "b", half(3, "b"))])
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_step_committed_in_two_generations(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 3), "a") + clean_steps(0, 2, range(2, 4), "a"))
    write(tmp_path, "b", clean_steps(0, 1, range(1, 3), "b") + clean_steps(0, 2, range(2, 4), "b"))
    assert analyze(tmp_path) == LedgerReport(3, 12, 16, 4, 0, 1)


def test_resumed_run_supersedes_the_earlier_run(tmp_path: Path) -> None:
    # run 0 reached step 4 in generation 3; the job was resumed from a checkpoint at step 2 as run 1
    for w in ("a", "b"):
        write(tmp_path, w, clean_steps(0, 3, range(1, 5), w) + clean_steps(1, 1, range(3, 6), w))
    assert analyze(tmp_path) == LedgerReport(5, 20, 20, 0, 0, 0)


def test_resumed_run_that_reads_differently_is_judged_on_its_own_reads(tmp_path: Path) -> None:
    write(tmp_path, "a", [*clean_steps(0, 1, range(1, 4), "a"), contrib(1, 1, 3, "a", [[8, 12]]), commit(1, 1, 3)])
    write(tmp_path, "b", clean_steps(0, 1, range(1, 4), "b"))  # b's run-0 read of step 3 is superseded
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, "a", clean_steps(0, 1, range(1, 4), "a"), tail='{"run":0,"g":1,"c":4,"cu')
    write(tmp_path, "b", clean_steps(0, 1, range(1, 4), "b"), tail='{"run":0,"g":1,"s":4,"w":"b","p":[[14,')
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_writer_records_are_what_analyze_reads(tmp_path: Path) -> None:
    assert ENV_VAR == "SLURM_ELASTIC_LEDGER_DIR"
    writers = {w: LedgerWriter(tmp_path, f"n1:{w}:0", run=0) for w in ("a", "b")}
    try:
        for s in range(1, 4):
            for w, writer in writers.items():
                writer.contribute(1, s, [(lo, hi) for lo, hi in half(s, w)])
                writer.commit(1, s, s * STEP)
    finally:
        for writer in writers.values():
            writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n1_a_0.jsonl", "n1_b_0.jsonl"]
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


def test_a_resumed_worker_appending_after_a_torn_line_loses_nothing(tmp_path: Path) -> None:
    """A requeued job keeps its worker ids, so run 1 appends to the file whose last line run 0 tore."""
    for w in ("a", "b"):
        writer = LedgerWriter(tmp_path, w, run=0)
        for s in range(1, 3):
            writer.contribute(1, s, [(lo, hi) for lo, hi in half(s, w)])
            writer.commit(1, s, s * STEP)
        writer.close()
    with (tmp_path / "a.jsonl").open("a") as f:
        f.write('{"run":0,"g":1,"s":3,"w":"a","p":[[8,')  # SIGKILL in the middle of a write
    for w in ("a", "b"):
        writer = LedgerWriter(tmp_path, w, run=1)
        writer.contribute(1, 3, [(lo, hi) for lo, hi in half(3, w)])
        writer.commit(1, 3, 3 * STEP)
        writer.close()
    assert analyze(tmp_path) == LedgerReport(3, 12, 12, 0, 0, 0)


# --- writing ------------------------------------------------------------------------------------------


def test_a_short_write_is_finished_not_left_as_a_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = LedgerWriter(tmp_path, "w1", run=0)
    real_write = os.write
    calls: list[int] = []

    def short_once(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, data[: len(data) // 2] if len(calls) == 1 else data)

    monkeypatch.setattr(os, "write", short_once)
    writer.contribute(1, 1, [(0, 4)])
    monkeypatch.undo()
    writer.close()
    assert len(calls) == 2
    assert [json.loads(line) for line in (tmp_path / "w1.jsonl").read_text().splitlines()] == [
        {"run": 0, "g": 1, "s": 1, "w": "w1", "p": [[0, 4]]}
    ]


def test_a_commit_is_on_disk_before_the_next_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = LedgerWriter(tmp_path, "w1", run=0)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    writer.contribute(1, 1, [(0, 4)])
    assert synced == []
    writer.commit(1, 1, 4)
    assert len(synced) == 1
    writer.close()


def test_a_full_disk_is_an_error_naming_the_file(full_disk: Path) -> None:
    writer = LedgerWriter(full_disk, "w1", run=0)
    with pytest.raises(LedgerError, match=r"w1\.jsonl: No space left on device"):
        writer.contribute(1, 1, [(0, 4)] * 2000)
    writer.close()
