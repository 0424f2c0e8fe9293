"""hooks.toml: per-node overrides, strict keys and types, and a file root refuses to trust."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.hooks.settings import HookSettings, expand_node_path, load_settings, parse_settings

TEXT = """
cache_dir = "/dev/shm/se/%n"
min_free_shm_mb = 100
notify_timeout_s = 1
[node.n3]
min_free_shm_mb = 999999999
prolog = false
[node.n4]
epilog_cleanup = false
"""


def test_per_node_tables_override_the_top_level() -> None:
    data = tomllib.loads(TEXT)
    n3 = parse_settings(data, "n3")
    n1 = parse_settings(data, "n1")
    assert (n3.min_free_shm_mb, n3.prolog, n3.epilog_cleanup) == (999999999, False, True)
    assert (n1.min_free_shm_mb, n1.prolog) == (100, True)
    assert n1.notify_timeout_s == 1.0 and n1.cache_dir == "/dev/shm/se/%n"
    assert parse_settings(data, None) == n1


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("cache_dirr = '/x'", "unknown setting 'cache_dirr'"),
        ("min_free_shm_mb = '100'", "must be a int"),
        ("prolog = 1", "must be a bool"),
        ("min_free_shm_mb = true", "must be a int"),
        ("min_free_shm_mb = -1", "0 or more"),
        ("notify_timeout_s = 0", r"\(0, 3600\]"),
        ("check_gpus = 'maybe'", "valid: auto, yes, no"),
        ("watch_s = 55", r"\[0, 50\]"),
        ("watch_every_s = 0.001", r"\[0.05, 10\]"),
        ("cache_dir = 'relative'", "absolute"),
        ("node = 3", "table of per-node tables"),
        ("[node.n3]\nbogus = 1", r"\[node.n3\]: unknown setting 'bogus'"),
    ],
)
def test_invalid_settings_name_key_and_value(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_settings(tomllib.loads(text), "n3")


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(str(tmp_path), "n1", {}) == (HookSettings(), None)
    assert load_settings(None, "n1", {}) == (HookSettings(), None)


def test_a_broken_file_is_reported_and_defaults_used(tmp_path: Path) -> None:
    (tmp_path / "hooks.toml").write_text("min_free_shm_mb = [")
    settings, warning = load_settings(str(tmp_path), "n1", {})
    assert settings == HookSettings()
    assert warning is not None and "hooks.toml" in warning


@pytest.mark.skipif(os.geteuid() != 0, reason="the ownership rule applies to root")
@pytest.mark.parametrize(("owner", "mode"), [(12345, 0o644), (0, 0o664), (0, 0o646)])
def test_root_ignores_a_file_others_could_change(tmp_path: Path, owner: int, mode: int) -> None:
    path = tmp_path / "hooks.toml"
    path.write_text("prolog = false\n")
    os.chown(path, owner, -1)
    os.chmod(path, mode)
    settings, warning = load_settings(str(tmp_path), "n1", {})
    assert settings.prolog is True
    assert warning is not None and "owned by root and writable by root only" in warning


def test_a_symlinked_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "real.toml").write_text("prolog = false\n")
    (tmp_path / "hooks.toml").symlink_to(tmp_path / "real.toml")
    settings, warning = load_settings(str(tmp_path), "n1", {})
    assert settings.prolog is True and warning is not None and "not a regular file" in warning


def test_cache_dir_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "hooks.toml").write_text("cache_dir = '/from/file'\n")
    settings, _ = load_settings(str(tmp_path), "n1", {"SLURM_ELASTIC_CACHE_DIR": "/from/env"})
    assert settings.cache_dir == "/from/env"
    settings, warning = load_settings(str(tmp_path), "n1", {"SLURM_ELASTIC_CACHE_DIR": "relative"})
    assert settings.cache_dir == "/from/file" and warning is not None


def test_expand_node_path() -> None:
    assert expand_node_path("/dev/shm/se/%n", "n3") == "/dev/shm/se/n3"
    assert expand_node_path("/a/%%n/%n%", "n3") == "/a/%n/n3%"
    assert "%" not in expand_node_path("/a/%h", "n3")
