"""Paths root may act in: reached from / through root's directories, links followed only when root's."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from slurm_elastic.hooks.safedir import UnsafePath, check_root_file, check_root_tree, open_root_dir

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(os.geteuid() != 0, reason="judges ownership by root: needs root"),
]
NOBODY = 65534


def opened(path: Path, **kwargs: int) -> os.stat_result:
    fd = open_root_dir(str(path), **kwargs)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def test_creates_missing_directories_with_their_modes(tmp_path: Path) -> None:
    st = opened(tmp_path / "a" / "b" / "cache", create_mode=0o1777)
    assert stat.S_IMODE(st.st_mode) == 0o1777 and st.st_uid == 0
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755
    (tmp_path / "a" / "b" / "cache").chmod(0o700)
    assert stat.S_IMODE(opened(tmp_path / "a" / "b" / "cache", create_mode=0o1777).st_mode) == 0o1777
    with pytest.raises(FileNotFoundError):
        open_root_dir(str(tmp_path / "missing"))


def test_roots_links_are_followed_others_are_not(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "roots").symlink_to(real)
    (tmp_path / "relative").symlink_to("real/../real")
    assert opened(tmp_path / "roots").st_ino == real.stat().st_ino
    assert opened(tmp_path / "relative").st_ino == real.stat().st_ino
    (tmp_path / "users").symlink_to(real)
    os.lchown(tmp_path / "users", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=rf"{tmp_path}/users is a symbolic link of uid 65534, not root's"):
        open_root_dir(str(tmp_path / "users" / "x"), create_mode=0o1777)
    assert list(real.iterdir()) == []


def test_a_directory_others_control_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="owned by uid 65534, not root"):
        open_root_dir(str(theirs / "cache"), create_mode=0o1777)
    assert list(theirs.iterdir()) == []
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafePath, match=r"writable by group or others \(drwxrwxrwx\)"):
        open_root_dir(str(open_dir / "cache"), create_mode=0o1777)
    open_dir.chmod(0o1777)  # sticky: no one may replace what root makes in it
    os.close(open_root_dir(str(open_dir / "cache"), create_mode=0o1777))


def test_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "roots").write_text("")
    with pytest.raises(NotADirectoryError):
        open_root_dir(str(tmp_path / "roots" / "x"))
    (tmp_path / "users").write_text("")
    os.chown(tmp_path / "users", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match="is not a directory, and belongs to uid 65534"):
        open_root_dir(str(tmp_path / "users" / "x"))
    with pytest.raises(UnsafePath, match="not an absolute path"):
        open_root_dir("relative/x")


def test_files_and_trees_root_executes(tmp_path: Path) -> None:
    tree = tmp_path / "site"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("")
    (tree / "link").symlink_to("/etc")
    with socket.socket(socket.AF_UNIX) as listening:  # a step's socket, as a dev cluster's spool holds
        listening.bind(str(tree / "pkg" / "n1_7.0"))
    (tree / "pkg" / "n1_7.0").chmod(0o777)
    assert check_root_tree(str(tree)) == [] and check_root_file(str(tree / "pkg" / "mod.py")) is None
    assert check_root_tree(str(tmp_path / "absent")) == []
    (tree / "pkg" / "mod.py").chmod(0o664)
    os.lchown(tree / "link", NOBODY, NOBODY)
    found = check_root_tree(str(tree))
    assert sorted(found) == [
        f"{tree}/link is a symbolic link of uid 65534, not root's",
        f"{tree}/pkg/mod.py is writable by group or others (-rw-rw-r--)",
    ]
    assert (
        check_root_file(str(tree / "pkg" / "mod.py"))
        == f"{tree}/pkg/mod.py is writable by group or others (-rw-rw-r--)"
    )
    assert "symbolic link of uid 65534" in str(check_root_file(str(tree / "link" / "passwd")))
