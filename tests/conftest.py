"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog


def _mount_tmpfs(mount: Path, size: str) -> None:
    """A tmpfs of `size` at `mount`. Needs root (CI runs as root); elsewhere the test is skipped, and under
    CI=true it fails."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (root needed): {done.stderr.decode().strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


class Tmpfs:
    """Small file systems of a test's own under its tmp_path (`mount`), filled up on demand (`fill`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[Path] = []

    def mount(self, name: str, size: str) -> Path:
        path = self.root / name
        _mount_tmpfs(path, size)
        self.mounts.append(path)
        return path

    @staticmethod
    def fill(mount: Path, pad: tuple[Path, ...] = ()) -> None:
        """Fill the file system at `mount`: every write that needs more room there fails with ENOSPC. A file
        being appended to may still have room in its last page: `pad` files get newlines until it is gone."""
        with open(mount / "filler", "ab", buffering=0) as fh:
            try:
                while fh.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        for path in pad:
            with open(path, "ab", buffering=0) as fh:
                try:
                    while fh.write(b"\n"):
                        pass
                except OSError:
                    pass

    def unmount_all(self) -> None:
        for path in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(path)], check=False)
        self.mounts.clear()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    """Mount small file systems for a test (root needed); each is unmounted at the test's end."""
    mounts = Tmpfs(tmp_path)
    try:
        yield mounts
    finally:
        mounts.unmount_all()


@pytest.fixture
def full_disk(tmpfs: Tmpfs) -> Path:
    """A directory on a tiny file system that is full: every write there fails with ENOSPC."""
    mount = tmpfs.mount("full", "64k")
    tmpfs.fill(mount)
    return mount


@pytest.fixture(autouse=True)
def structlog_as_found() -> Iterator[None]:
    """Each test starts with structlog's defaults and leaves them so: an entry point run in-process (a hook
    filters library lines below WARNING, the CLI binds its stderr) must not change what later tests see."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)
