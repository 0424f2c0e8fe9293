"""The hook entry points end to end, without Slurm: a fake Slurm client, a real coordinator, real files."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.eventtypes import DrainRequested, of_kind
from slurm_elastic.hooks import base, epilog, epilog_slurmctld, healthcheck, prolog
from slurm_elastic.hooks.dedupe import StateFile
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.slurm.errors import SlurmTimeout
from slurm_elastic.slurm.records import JobInfo, NodeInfo
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(60)
UID = str(os.getuid())


class FakeSlurm:
    def __init__(self) -> None:
        self.jobs: dict[str, JobInfo] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.on_node: dict[str, list[tuple[str, int]]] = {}
        self.updates: list[tuple[str, str, str]] = []
        self.queries = 0
        self.stalls = 0  # how many queries time out before slurmctld answers again
        self.timeouts: list[float] = []  # the timeout each client was made with

    def job(self, job_id: str) -> JobInfo | None:
        return self.jobs.get(job_id)

    def client(self, timeout_s: float) -> FakeSlurm:
        self.timeouts.append(timeout_s)
        return self

    def node(self, name: str) -> NodeInfo | None:
        self.queries += 1
        if self.stalls:
            self.stalls -= 1
            time.sleep(min(self.timeouts[-1], 0.5))  # scaled down: the hook's own bounds are what is tested
            raise SlurmTimeout(["scontrol", "show", "node", name], None, "", why="timed out")
        return self.nodes.get(name, NodeInfo(name, "IDLE"))

    def running_jobs_on(self, node: str) -> list[tuple[str, int]]:
        return self.on_node.get(node, [])

    def set_node_state(self, node: str, state: str, reason: str) -> None:
        self.updates.append((node, state, reason))
        flags = frozenset() if state == "RESUME" else frozenset({state})
        self.nodes[node] = NodeInfo(node, "IDLE", flags, reason)

    def spool_dir(self) -> str:
        return "/tmp"


@pytest.fixture(scope="module")
def coordinator() -> Iterator[tuple[CoordinatorThread, str]]:
    secret = new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id="100", secret=secret, expected_workers=2)).start()
    try:
        yield thread, secret
    finally:
        thread.stop()


@pytest.fixture
def world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coordinator: tuple[CoordinatorThread, str]
) -> dict[str, Any]:
    thread, secret = coordinator
    hooks_dir = tmp_path / "hooks"
    hooks_dir.mkdir()
    settings = {
        "log_dir": str(tmp_path / "log"),
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache" / "%n"),
        "syslog": False,
        "check_gpus": "no",
        "min_free_shm_mb": 0,
        "min_free_spool_mb": 0,
    }
    (hooks_dir / "hooks.toml").write_text("".join(f"{k} = {_toml(v)}\n" for k, v in settings.items()))
    job_dir = tmp_path / "home" / "it's $(odd)" / "jobs" / "100"
    handle = JobHandle("100", thread.address, secret, "n1", os.getpid(), time.time()).write(job_dir)
    fake = FakeSlurm()
    for module in (prolog, epilog, healthcheck):
        monkeypatch.setattr(module, "HookSlurm", lambda timeout_s, **_: fake.client(timeout_s))
    monkeypatch.setattr("sys.stderr", io.StringIO())
    env = {"SLURM_ELASTIC_HOOKS_DIR": str(hooks_dir), "SLURM_JOB_UID": UID, "SLURM_JOB_COMMENT": "x"}
    return {"fake": fake, "env": env, "comment": f"slurm-elastic:{handle}", "tmp": tmp_path, "thread": thread}


def _toml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, str) else str(value)


def drains(world: dict[str, Any], reason_part: str) -> list[DrainRequested]:
    events = of_kind(world["thread"].coordinator.events.all(), DrainRequested)
    return [e for e in events if reason_part in e.reason]


def log_lines(world: dict[str, Any]) -> list[str]:
    path = world["tmp"] / "log" / "hooks.log"
    return path.read_text().splitlines() if path.exists() else []


def running(job_id: str, nodes: tuple[str, ...], comment: str) -> JobInfo:
    return JobInfo(job_id, state="RUNNING", base_state="RUNNING", nodes=nodes, comment=comment)


def test_epilog_of_a_shrink_tells_the_coordinator_and_cleans(world: dict[str, Any]) -> None:
    world["fake"].jobs["100"] = running("100", ("n1", "n2"), world["comment"])
    cache = world["tmp"] / "cache" / "n3" / "100"
    cache.mkdir(parents=True)
    env = {**world["env"], "SLURM_JOB_ID": "100", "SLURMD_NODENAME": "n3", "SLURM_NODELIST": "n3"}
    assert base.main("epilog", lambda _: epilog.run(env)) == 0
    (event,) = drains(world, "n3 left running job 100")
    assert (event.nodes, event.mode, event.source) == (("n3",), "now", "epilog")
    assert not cache.exists()
    lines = log_lines(world)
    assert any("epilog job=100 node=n3 action=notify result=ok coordinator_job=100 mode=now" in line for line in lines)
    assert any("action=cleanup result=ok killed=0 cache=removed" in line for line in lines)


def test_epilog_of_the_core_jobs_end_tells_nobody(world: dict[str, Any]) -> None:
    job = running("100", ("n1",), world["comment"])
    world["fake"].jobs["100"] = replace(job, state="COMPLETING", base_state="COMPLETED")
    epilog.run({**world["env"], "SLURM_JOB_ID": "100", "SLURMD_NODENAME": "n1"})
    assert drains(world, "job 100 itself") == []
    assert any("action=notify result=skip" in line for line in log_lines(world))


def test_epilog_uses_the_environments_comment_when_slurm_does_not_answer(world: dict[str, Any]) -> None:
    env = {**world["env"], "SLURM_JOB_ID": "101", "SLURMD_NODENAME": "n4", "SLURM_JOB_COMMENT": world["comment"]}
    epilog.run(env)  # job 101 unknown to the fake: a satellite of 100 that is gone
    assert drains(world, "satellite job 101 of job 100 ended (gone)")


@pytest.mark.parametrize(
    ("comment", "result"),
    [
        ("a plain comment", "result=not_elastic"),
        ("slurm-elastic:/etc/../etc/coordinator.json", "result=refused"),
        ("slurm-elastic:/tmp/x/coordinator.json\nslurm-elastic-hook forged result=ok", "result=refused"),
    ],
)
def test_epilog_of_other_jobs(world: dict[str, Any], comment: str, result: str) -> None:
    world["fake"].jobs["102"] = running("102", ("n1",), comment)
    epilog.run({**world["env"], "SLURM_JOB_ID": "102", "SLURMD_NODENAME": "n3"})
    lines = log_lines(world)
    assert any(result in line for line in lines)
    assert not any("forged" in line.split('"')[0] for line in lines)  # a newline never starts a line


def test_epilog_after_the_coordinator_removed_its_handle(world: dict[str, Any]) -> None:
    world["fake"].jobs["110"] = running("110", ("n1",), "slurm-elastic:/nonexistent/jobs/110/coordinator.json")
    epilog.run({**world["env"], "SLURM_JOB_ID": "110", "SLURMD_NODENAME": "n1"})
    assert any("job=110 node=n1 action=find result=gone" in line for line in log_lines(world))


def test_epilog_refuses_a_handle_others_can_read(world: dict[str, Any]) -> None:
    path = world["comment"].removeprefix("slurm-elastic:")
    os.chmod(path, 0o644)
    world["fake"].jobs["103"] = running("103", ("n1",), world["comment"])
    epilog.run({**world["env"], "SLURM_JOB_ID": "103", "SLURMD_NODENAME": "n3"})
    assert any("action=find result=refused" in line and "0600" in line for line in log_lines(world))


def test_prolog_healthy_unhealthy_and_off(world: dict[str, Any]) -> None:
    env = {**world["env"], "SLURM_JOB_ID": "104", "SLURMD_NODENAME": "n3"}
    assert prolog.run(env) == base.EX_OK
    assert world["fake"].updates == []
    hooks_toml = Path(env["SLURM_ELASTIC_HOOKS_DIR"]) / "hooks.toml"
    hooks_toml.write_text(hooks_toml.read_text() + "[node.n3]\nmin_free_shm_mb = 999999999\n")
    assert prolog.run(env) == base.EX_REFUSE
    ((node, state, reason),) = world["fake"].updates
    assert (node, state) == ("n3", "DRAIN") and reason.startswith("slurm-elastic prolog: shm: ")
    assert prolog.run({**env, "SLURMD_NODENAME": "n2"}) == base.EX_OK  # the override is n3's only
    hooks_toml.write_text(hooks_toml.read_text() + "prolog = false\n")
    assert prolog.run(env) == base.EX_OK


def test_prolog_asks_a_slow_slurmctld_again_within_its_wrappers_bound(world: dict[str, Any]) -> None:
    fake, env = world["fake"], {**world["env"], "SLURM_JOB_ID": "107", "SLURMD_NODENAME": "n3"}
    hooks_toml = Path(env["SLURM_ELASTIC_HOOKS_DIR"]) / "hooks.toml"
    hooks_toml.write_text(hooks_toml.read_text() + "[node.n3]\nmin_free_shm_mb = 999999999\n")
    fake.stalls = 2  # e.g. a slurmctld just restarted: the first two questions time out
    assert prolog.run(env) == base.EX_REFUSE
    ((node, state, reason),) = fake.updates
    assert (node, state) == ("n3", "DRAIN") and reason.startswith("slurm-elastic prolog: shm: ")
    assert sum("action=set_state result=retry" in line for line in log_lines(world)) == 2
    assert max(fake.timeouts) <= base.SLURM_TIMEOUT_S

    # A wrapper bound of 5 s leaves 2 s: the last attempt gets what is left, then the job is refused anyway
    # (Slurm drains the node itself).
    fake.updates.clear()
    fake.stalls, fake.timeouts[:] = 100, []
    began = time.monotonic()
    assert prolog.run({**env, base.ENV_HOOK_TIMEOUT_S: "5"}) == base.EX_REFUSE
    assert time.monotonic() - began < 5 and not fake.updates  # done before the wrapper would kill it
    assert fake.timeouts[-1] < base.SLURM_TIMEOUT_S  # bounded by the time left, not a full call's timeout
    assert "slurmctld did not answer in time" in log_lines(world)[-1]


def test_healthcheck_tells_each_job_once_per_state(world: dict[str, Any]) -> None:
    fake = world["fake"]
    fake.jobs["105"] = running("105", ("n2",), world["comment"])
    fake.jobs["106"] = running("106", ("n2",), "not elastic")
    fake.on_node["n2"] = [("105", int(UID)), ("106", int(UID))]
    env = {**world["env"], "SLURMD_NODENAME": "n2"}
    healthcheck.run(env)
    assert drains(world, "Slurm marks n2") == []
    fake.nodes["n2"] = NodeInfo("n2", "MIXED", frozenset({"DRAIN"}), "maintenance")
    for _ in range(3):
        healthcheck.run(env)
    (drain,) = drains(world, "Slurm marks n2 DRAIN: maintenance")
    assert (drain.mode, drain.source) == ("boundary", "healthcheck")
    assert sum("job=106 node=n2 action=find result=not_elastic" in line for line in log_lines(world)) == 1
    fake.nodes["n2"] = NodeInfo("n2", "MIXED", frozenset({"FAIL"}), "dying")
    healthcheck.run(env)
    healthcheck.run(env)
    (fail,) = drains(world, "Slurm marks n2 FAIL: dying")
    assert fail.mode == "now"


def test_healthcheck_drains_a_sick_node_and_tells_its_jobs_in_the_same_run(world: dict[str, Any]) -> None:
    fake = world["fake"]
    fake.jobs["107"] = running("107", ("n4",), world["comment"])
    fake.on_node["n4"] = [("107", int(UID))]
    hooks_toml = Path(world["env"]["SLURM_ELASTIC_HOOKS_DIR"]) / "hooks.toml"
    hooks_toml.write_text(hooks_toml.read_text() + "[node.n4]\nmin_free_shm_mb = 999999999\n")
    healthcheck.run({**world["env"], "SLURMD_NODENAME": "n4"})
    assert [(n, s) for n, s, _ in fake.updates] == [("n4", "DRAIN")]
    (drain,) = drains(world, "Slurm marks n4 DRAIN: slurm-elastic healthcheck: shm")
    assert drain.mode == "boundary"
    # Healthy again: the next full check lifts its own drain.
    hooks_toml.write_text(hooks_toml.read_text().replace("999999999", "0"))
    files = StateFile(world["tmp"] / "state", "n4")
    files.save(replace(files.load(), last_full_check=0.0))
    healthcheck.run({**world["env"], "SLURMD_NODENAME": "n4"})
    assert fake.updates[-1] == ("n4", "RESUME", "")


def test_healthcheck_logs_one_update_when_the_read_after_it_times_out(world: dict[str, Any]) -> None:
    fake = world["fake"]
    hooks_toml = Path(world["env"]["SLURM_ELASTIC_HOOKS_DIR"]) / "hooks.toml"
    hooks_toml.write_text(hooks_toml.read_text() + "[node.n4]\nmin_free_shm_mb = 999999999\n")
    update = fake.set_node_state
    fake.set_node_state = lambda *a: (update(*a), setattr(fake, "stalls", 1))  # slurmctld slows down after it
    healthcheck.run({**world["env"], "SLURMD_NODENAME": "n4"})
    assert [(n, s) for n, s, _ in fake.updates] == [("n4", "DRAIN")]
    lines = [line for line in log_lines(world) if "node=n4" in line and "action=set_state" in line]
    assert len(lines) == 1 and "result=ok state=DRAIN" in lines[0], lines  # one update, said once
    assert "healthcheck node=n4 action=query result=error" in log_lines(world)[-1]


def test_a_watching_health_check_reports_a_drain_within_its_run(world: dict[str, Any]) -> None:
    fake = world["fake"]
    fake.jobs["109"] = running("109", ("n1",), world["comment"])
    fake.on_node["n1"] = [("109", int(UID))]
    hooks_toml = Path(world["env"]["SLURM_ELASTIC_HOOKS_DIR"]) / "hooks.toml"
    hooks_toml.write_text(hooks_toml.read_text() + "watch_s = 3.0\nwatch_every_s = 0.05\n")
    drained = threading.Timer(0.5, lambda: fake.nodes.update(n1=NodeInfo("n1", "MIXED", frozenset({"DRAIN"}), "m")))
    drained.start()
    started = time.monotonic()
    healthcheck.run({**world["env"], "SLURMD_NODENAME": "n1"})
    assert time.monotonic() - started >= 2.5  # it watched for the whole time
    (drain,) = drains(world, "Slurm marks n1 DRAIN: m")
    assert drain.mode == "boundary"
    assert fake.queries > 20


def test_healthcheck_skips_while_the_previous_run_holds_the_lock(world: dict[str, Any]) -> None:
    env = {**world["env"], "SLURMD_NODENAME": "n1"}
    files = StateFile(world["tmp"] / "state", "n1")
    with files.locked(until=time.time() + 30):  # still watching: skipped without a word
        healthcheck.run(env)
    assert world["fake"].queries == 0
    assert not any("action=run" in line for line in log_lines(world))
    with files.locked(until=time.time() - 5):  # overran: worth a line
        healthcheck.run(env)
    assert world["fake"].queries == 0
    (busy,) = [line for line in log_lines(world) if "action=run" in line]
    assert "healthcheck node=n1 action=run result=busy late_s=" in busy


def test_epilog_slurmctld_tells_the_core_about_a_satellites_nodes(world: dict[str, Any]) -> None:
    env = {**world["env"], "SLURM_JOB_ID": "108", "SLURM_JOB_NODELIST": "n[3-4]", "SLURM_JOB_COMMENT": world["comment"]}
    assert epilog_slurmctld.run(env) == base.EX_OK
    (drain,) = drains(world, "satellite job 108 of job 100 ended")
    assert (drain.nodes, drain.source) == (("n3", "n4"), "epilog_slurmctld")


def test_a_hostile_environment_is_one_refused_line(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**world["env"], "SLURM_JOB_ID": "$(reboot)", "SLURMD_NODENAME": "n1"}
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    assert base.main("epilog", lambda _: epilog.run(env)) == 0
    assert stream.getvalue().count("\n") == 1 and "action=parse result=refused" in stream.getvalue()
