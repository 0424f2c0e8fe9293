"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tiny file system that is full: every write there fails with ENOSPC.

    Needs root to mount a tmpfs (CI runs as root); elsewhere the test is skipped, and under CI=true it fails.
    """
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (root needed): {done.stderr.decode().strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        with open(mount / "filler", "wb", buffering=0) as fh:  # fill it up
            try:
                while fh.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
