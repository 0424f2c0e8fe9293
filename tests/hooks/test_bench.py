"""The notify benchmark's bookkeeping, on hand-written event files (the runs themselves need the cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slurm_elastic.eventtypes import DrainRequested, MembershipChange, NodeLost
from slurm_elastic.hooks.bench import Job, _figures, hooks_dir_of
from slurm_elastic.jobdir import job_dir


def test_hooks_dir_of_a_cluster(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    cluster: Any = SimpleNamespace(slurm_conf_path=conf)
    assert hooks_dir_of(cluster) is None
    conf.write_text("ClusterName=x\n")
    assert hooks_dir_of(cluster) is None
    conf.write_text("ClusterName=x\nEpilog=/opt/se hooks/epilog\nPrologFlags=Alloc\n")
    assert hooks_dir_of(cluster) == Path("/opt/se hooks")


def change(time: float, world: int) -> dict[str, Any]:
    ranks = tuple(f"n{i}:0" for i in range(world))
    return {
        "event": "membership_change",
        "time": time,
        **MembershipChange(2, "x", 4, world, ranks, (), (), None, "Lost").fields(),
    }


def test_eviction_and_who_told_first(tmp_path: Path) -> None:
    events = [
        change(5.0, 4),
        {"event": "drain_requested", "time": 10.4, **DrainRequested(("n3",), "graceful", "x", "healthcheck").fields()},
        {"event": "drain_requested", "time": 11.0, **DrainRequested(("n3",), "graceful", "x", "local").fields()},
        change(10.7, 3),
    ]
    path = job_dir("7", tmp_path / "home") / "events.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    job = Job(tmp_path, {"SLURM_ELASTIC_HOME": str(tmp_path / "home")}, "7")
    assert job.world() == 3
    assert job.eviction_after(10.0, 3) == (0.7, "healthcheck")
    lost = {"event": "node_lost", "time": 20.1, **NodeLost("n2", ("n2:0",)).fields()}
    path.write_text(path.read_text() + json.dumps(lost) + "\n" + json.dumps(change(20.2, 2)) + "\n")
    assert job.eviction_after(20.0, 2) == (0.2, "connection lost")


def test_figures_are_medians() -> None:
    samples: dict[str, list[Any]] = {
        "drain": [0.5, 1.3, 0.4],
        "shrink": [0.03, 0.06, 0.02],
        "shrink_epilog_report": [0.6, None, 1.0],
    }
    assert _figures(samples) == {"drain_to_evict_s": 0.5, "shrink_to_evict_s": 0.03, "shrink_to_epilog_report_s": 0.8}
    assert _figures({**samples, "shrink_epilog_report": [None]})["shrink_to_epilog_report_s"] is None
