"""Every hook action is one line: hostile values stay inside it, and the file sink is safe for root."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from slurm_elastic.hooks.hooklog import HookLog, format_line, format_value


def test_the_documented_shape() -> None:
    fields = {"job": "123", "node": "n3", "action": "notify", "result": "ok", "duration_ms": 12, "mode": "now"}
    assert format_line("epilog", fields) == (
        "slurm-elastic-hook epilog job=123 node=n3 action=notify result=ok duration_ms=12 mode=now"
    )


def test_none_fields_are_left_out() -> None:
    assert format_line("healthcheck", {"job": None, "node": "n1", "action": "run", "result": "busy"}) == (
        "slurm-elastic-hook healthcheck node=n1 action=run result=busy"
    )


@pytest.mark.parametrize(
    "value",
    ["a b", 'say "hi"', "x\nslurm-elastic-hook forged result=ok", "\x1b[31mred", "$(id)", "`id`", "", "é"],
)
def test_hostile_values_stay_in_one_quoted_token(value: str) -> None:
    text = format_value(value)
    assert "\n" not in text and "\x1b" not in text
    assert text.startswith('"') and text.endswith('"')
    assert text.isascii()


def test_long_values_are_cut() -> None:
    assert len(format_value("x" * 10_000)) < 600


def test_lines_go_to_stderr_and_the_log_file(tmp_path: Path) -> None:
    stream = io.StringIO()
    log = HookLog("prolog", job="5", node="n2", log_dir=str(tmp_path / "log"), use_syslog=False, stream=stream)
    line = log.event("check", "unhealthy", reason="shm: 1 MB free")
    assert stream.getvalue() == line + "\n"
    written = (tmp_path / "log" / "hooks.log").read_text()
    assert written.endswith(line + "\n") and written.count("\n") == 1
    assert oct((tmp_path / "log" / "hooks.log").stat().st_mode & 0o777) == oct(0o640 & ~_umask())


def test_a_symlink_in_the_log_dir_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "hooks.log").symlink_to(victim)
    HookLog("epilog", log_dir=str(tmp_path / "log"), use_syslog=False, stream=io.StringIO()).event("x", "y")
    assert victim.read_text() == "keep\n"


def test_a_closed_stderr_does_not_kill_the_hook(tmp_path: Path) -> None:
    stream = io.StringIO()
    stream.close()
    HookLog("epilog", use_syslog=True, stream=stream).event("cleanup", "ok")


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
