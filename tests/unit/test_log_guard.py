"""A log line that cannot be written (stderr on a full disk, a closed stream, a broken pipe) costs that line,
never the loop that wrote it: events go on in memory, the failure is recorded once, and the coordinator's
ticker keeps pulsing while every write fails. Seen: a Slurm job's `.out` on a full file system killed the
ticker, and every agent declared the coordinator lost one lease later."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
import structlog

import slurm_elastic
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.events import EventLog
from slurm_elastic.logs import configure_logging
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import Channel, connect, new_secret

pytestmark = pytest.mark.timeout(60)


class Stream(io.StringIO):
    """A text stream whose writes fail with `error` while `failing` is set."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.failing = True

    def write(self, text: str) -> int:
        if self.failing:
            raise self.error
        return super().write(text)


@pytest.fixture
def structlog_to() -> Iterator[Callable[[TextIO], None]]:
    """Point structlog's own PrintLogger (a worker's set-up is its script's: no guard of ours) at a stream."""
    saved = structlog.get_config()

    def use(stream: TextIO) -> None:
        structlog.configure(
            processors=[structlog.processors.KeyValueRenderer(key_order=["event"])],
            logger_factory=structlog.PrintLoggerFactory(stream),
            cache_logger_on_first_use=False,
        )

    yield use
    structlog.configure(**saved)


SINKS = {
    "ENOSPC": lambda: Stream(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
    "broken pipe": lambda: Stream(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))),
    "closed stream": lambda: Stream(ValueError("I/O operation on closed file.")),
}


@pytest.mark.parametrize("sink", list(SINKS))
def test_events_go_on_while_their_log_lines_fail_and_the_failure_is_recorded_once(
    sink: str, structlog_to: Callable[[TextIO], None]
) -> None:
    stream = SINKS[sink]()
    structlog_to(stream)
    events = EventLog("job")
    for step in range(3):
        events.emit("progress", step=step)  # raised out of emit before: the caller died with it
    assert [e["event"] for e in events.all()] == ["progress", "log_write_failed", "progress", "progress"]
    assert str(stream.error) in events.all()[1]["error"]
    stream.failing = False
    events.emit("progress", step=3)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "event='progress' job='job' step=3"
    assert lines[1].startswith("event='log_lines_dropped' count=3 ")
    events.emit("progress", step=4)
    assert len(stream.getvalue().splitlines()) == 3, "the drops are reported once"


def test_log_lines_to_a_file_on_a_full_disk_are_dropped(
    full_disk: Path, structlog_to: Callable[[TextIO], None]
) -> None:
    stderr = open(full_disk / "stderr.log", "w")  # noqa: SIM115 - closed below, its unwritten lines dropped
    try:
        structlog_to(stderr)
        events = EventLog("job", full_disk / "events.jsonl")
        for step in range(3):
            events.emit("progress", step=step)
        kinds = [e["event"] for e in events.all()]
    finally:
        with contextlib.suppress(OSError):  # what it could not write is still in its buffer
            stderr.close()
    assert kinds.count("log_write_failed") == 1 and kinds.count("events_write_failed") == 1
    assert kinds.count("progress") == 3


def test_the_entry_points_sink_drops_what_it_cannot_write(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = structlog.get_config()
    stream = SINKS["ENOSPC"]()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        configure_logging("json")
        events = EventLog("job")
        events.emit("progress", step=1)
        assert [e["event"] for e in events.all()] == ["progress", "log_write_failed"]
        stream.failing = False
        events.emit("progress", step=2)
    finally:
        structlog.configure(**saved)
    assert '"event": "progress"' in stream.getvalue() and '"event": "log_lines_dropped"' in stream.getvalue()


def test_an_event_cut_short_by_a_full_disk_leaves_no_torn_line(tmpfs: Any) -> None:
    mount = tmpfs.mount("small", "8k")
    events = EventLog("job", mount / "events.jsonl")
    for step in range(40):  # 8 KiB: the file fills up part way through some line
        events.emit("progress", quiet=True, step=step, padding="x" * 150)
    text = (mount / "events.jsonl").read_text()
    assert text.endswith("\n") and all(line.endswith("}") for line in text.splitlines())
    assert [e["event"] for e in events.all()].count("events_write_failed") == 1


# --- the coordinator's ticker ----------------------------------------------------------------------


class Peer:
    """An agent or a worker connected to the coordinator: answers every pulse with a heartbeat, and keeps
    the time of each pulse."""

    def __init__(self, channel: Channel, heartbeat: msg.Heartbeat) -> None:
        self.channel = channel
        self.heartbeat = heartbeat
        self.pulses: list[float] = []
        self.received: list[Any] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                message = self.channel.recv()
                self.received.append(message)
                if isinstance(message, msg.Pulse):
                    self.pulses.append(time.monotonic())
                    self.channel.send(self.heartbeat)
        except (OSError, ConnectionError, ValueError):
            return

    def close(self) -> None:
        self.channel.close()
        self._thread.join(5)


@pytest.mark.parametrize("sink", ["file on a full disk", "ENOSPC stream"])
def test_the_coordinator_keeps_pulsing_while_every_write_fails(
    sink: str, full_disk: Path, structlog_to: Callable[[TextIO], None]
) -> None:
    secret, lease = new_secret(), 0.5
    config = CoordinatorConfig(
        job_id="j", secret=secret, expected_workers=2, min_workers=1, heartbeat_interval_s=0.05,
        lease_timeout_s=lease, rendezvous_timeout_s=1.0, events_path=full_disk / "events.jsonl",
    )  # fmt: skip
    thread = CoordinatorThread(config).start()
    peers: list[Peer] = []
    stderr = open(full_disk / "stderr.log", "w") if sink == "file on a full disk" else SINKS["ENOSPC"]()  # noqa: SIM115
    try:
        agent = connect(thread.address, secret=secret, job_id="j", role="agent")
        agent.send(msg.RegisterNode(node="n1", host="h", nproc=1, pid=os.getpid()))
        assert isinstance(agent.recv(timeout=10), msg.Ack)
        worker = connect(thread.address, secret=secret, job_id="j", role="worker")
        worker.send(msg.Register(worker_id="n1:0:0", node="n1", local_rank=0, pid=os.getpid(), committed_step=0))
        assert isinstance(worker.recv(timeout=10), msg.Registered)
        peers = [Peer(agent, msg.Heartbeat(generation=0, step=-1, phase="init"))]
        peers.append(Peer(worker, msg.Heartbeat(generation=1, step=0, phase="compute")))
        structlog_to(stderr)  # from now on every log line fails, and the events file is full
        deadline = time.monotonic() + 20
        while thread.view().generation == 0 and time.monotonic() < deadline:  # the ticker starts it (1 s)
            time.sleep(0.05)
        started = time.monotonic()
        time.sleep(4 * lease)
        view = thread.view()
        pulses = list(peers[0].pulses)
    finally:
        for peer in peers:
            peer.close()
        thread.stop()
        with contextlib.suppress(OSError):  # what it could not write is still in its buffer
            stderr.close()
    assert [p for p in pulses if p > started + 3 * lease], "pulses go on through every lease period"
    assert view.phase == "running" and view.generation == 1, view
    kinds = [e["event"] for e in thread.coordinator.events.all()]
    assert "membership_change" in kinds
    assert kinds.count("log_write_failed") == 1 and kinds.count("events_write_failed") == 1


def test_every_library_module_logs_through_the_guarded_logger() -> None:
    """A module that took structlog's own logger would let a full disk's write error out of its loops."""
    package = Path(slurm_elastic.__file__).parent
    direct = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if "structlog.get_logger(" in path.read_text() and path.name != "logs.py"
    ]
    assert direct == [], direct


ENTRY_POINT_AFTER_OUTPUT = """
import sys
from slurm_elastic import cli
print("a summary the command printed, still in stdout's buffer at exit")
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["--version"], ["agent", "--help"]])
def test_a_command_whose_output_is_on_a_full_disk_still_exits_with_its_own_code(
    full_disk: Path, command: list[str]
) -> None:
    """Python exits 120 when its flush of stdout at exit fails: a launcher that finished its job must not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as under sbatch
    with open(full_disk / "out", "ab") as out:
        argv = [sys.executable, "-c", ENTRY_POINT_AFTER_OUTPUT, *command]
        done = subprocess.run(argv, stdout=out, env=env, timeout=60)
    assert done.returncode == 0
