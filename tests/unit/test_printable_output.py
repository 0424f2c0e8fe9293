"""Every human-readable output shows a peer's, a worker's or the user's code's control characters as
escapes: `status`, console log lines, error messages, a failure's traceback. JSON output keeps the values
as they are, escaped so that printing it is safe too."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import structlog

from slurm_elastic.commands import jobs
from slurm_elastic.commands.common import fail
from slurm_elastic.commands.run import report
from slurm_elastic.launch.local import JobResult
from slurm_elastic.logs import configure_logging
from slurm_elastic.wire.messages import MemberStatus, StatusReply

HOSTILE = "PWNED\n2026-01-01 [info] job_finished\x1b[2J\x1b]0;title\x07\u009b31m\r\u202e\x7f"


def acts_on_a_terminal(text: str, newlines: bool = False) -> list[str]:
    """The characters of `text` a terminal would act on (newlines allowed or not)."""
    allowed = "\n" if newlines else ""
    return [c for c in text if (ord(c) < 0x20 and c not in allowed) or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]


def hostile_status() -> StatusReply:
    return StatusReply(
        job_id="10" + HOSTILE,
        state="running",
        generation=3,
        world_size=1,
        step=42,
        loss=1.5,
        samples_per_s=None,
        nodes=["n1" + HOSTILE],
        node_jobs={"n1" + HOSTILE: "11" + HOSTILE},
        members=[MemberStatus(worker_id=HOSTILE, node="n1", rank=0, step=42, phase=HOSTILE, last_seen_s=0.1)],
        pending=[HOSTILE],
        draining=[HOSTILE],
        events=[
            {"event": "worker_exited", "job": "10", "time": 0.0, "worker": HOSTILE, "stderr_tail": HOSTILE},
            {"event": HOSTILE, "job": "10", "time": 0.0, HOSTILE: HOSTILE},
        ],
    )


def test_status_shows_every_peer_provided_text_escaped_one_line_each() -> None:
    text = jobs.render_status(hostile_status())
    assert acts_on_a_terminal(text, newlines=True) == []
    assert "PWNED\\x0a2026-01-01 [info] job_finished\\x1b[2J" in text  # shown, readable, inert
    lines = text.split("\n")
    assert not any(line.startswith("2026-01-01") for line in lines)  # no line forged
    assert len(lines) == 9


def run_status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool) -> str:
    monkeypatch.setattr(jobs, "find_job", lambda job, user=None: None)
    monkeypatch.setattr(jobs, "status_of", lambda handle: hostile_status())
    assert jobs.run_status(argparse.Namespace(job="10", json=as_json, user=None)) == 0
    return capsys.readouterr().out


def test_the_status_command_prints_no_control_character(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert acts_on_a_terminal(run_status(monkeypatch, capsys, as_json=False), newlines=True) == []


def test_status_json_keeps_the_raw_values_in_printable_ascii(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_status(monkeypatch, capsys, as_json=True)
    assert all(0x20 <= ord(c) < 0x7F for c in out.rstrip("\n")), [c for c in out if not 0x20 <= ord(c) < 0x7F]
    assert StatusReply.model_validate(json.loads(out)) == hostile_status()  # lossless for tools


def render_console_line(event: dict[str, Any]) -> str:
    """One event through the processors `configure_logging("console")` sets (structlog restored after)."""
    saved = structlog.get_config()
    try:
        configure_logging("console")
        rendered: Any = dict(event)
        for processor in structlog.get_config()["processors"]:
            rendered = processor(None, "info", rendered)
        return str(rendered)
    finally:
        structlog.configure(**saved)


def test_console_log_lines_show_control_characters_as_escapes() -> None:
    line = render_console_line({"event": HOSTILE, "worker": HOSTILE, HOSTILE: 1, "stderr_tail": "x\x1b[2Jy"})
    assert acts_on_a_terminal(line) == [], line
    assert "x\\x1b[2Jy" in line


def test_an_error_message_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(f"job 1 failed: {HOSTILE}", 1) == 1
    err = capsys.readouterr().err
    assert acts_on_a_terminal(err, newlines=True) == []
    assert err.count("\n") == 2  # the message's own newline is kept, the rest is escaped


def test_a_failure_traceback_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    traceback = f"Traceback (most recent call last):\n  File 'train.py'\nValueError: {HOSTILE}"
    result = JobResult("failed", "the same failure happened 3 times", traceback, {})
    assert report("1", result, ["python", "train.py"]) == 1
    err = capsys.readouterr().err
    assert acts_on_a_terminal(err, newlines=True) == []
    assert "Traceback (most recent call last):\n  File 'train.py'\n" in err


def test_status_json_is_strict_json_when_a_number_is_not_finite() -> None:
    overflowed = hostile_status().model_copy(
        update={"loss": float("inf"), "events": [{"event": "x", "loss": float("nan")}]}
    )
    out = jobs.status_json(overflowed)
    assert "Infinity" not in out and "NaN" not in out
    value = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in the status JSON"))
    assert value["loss"] is None and value["events"][0]["loss"] is None and value["step"] == 42
