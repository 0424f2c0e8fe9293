"""The processes that play a benchmark's simulated peers (`testing.swarm`, `testing.nodeswarm`): each started
with its share of the peers and the job's secret, spoken to one JSON line at a time, always stopped."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
from typing import Any

from slurm_elastic.errors import ElasticError

Process = subprocess.Popen[str]


def shares(count: int, processes: int) -> list[tuple[int, int]]:
    """`count` peers split into at most `processes` contiguous ranges FIRST:END."""
    parts = max(1, min(processes, count))
    return list(itertools.pairwise(count * i // parts for i in range(parts + 1)))


def start(argv: list[str], flag: str, ranges: list[tuple[int, int]], secret: str, bench: str) -> list[Process]:
    """One process per range (`flag FIRST:END`), each ready (its first line read) before this returns."""
    env = {**os.environ, "SLURM_ELASTIC_SECRET": secret}
    procs = [
        subprocess.Popen([*argv, flag, f"{a}:{b}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        for a, b in ranges
    ]
    try:
        for proc in procs:
            read_line(proc, bench)  # {"ready": n}: every connection made and authenticated
    except BaseException:
        stop(procs)
        raise
    return procs


def read_line(proc: Process, bench: str) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise ElasticError(f"bench {bench}: a swarm process ended (exit {proc.wait()})")
    return dict(json.loads(line))


def send_line(proc: Process, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def stop(procs: list[Process]) -> None:
    """Close their input (each ends its peers and exits), then wait; kill what does not end."""
    for proc in procs:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
