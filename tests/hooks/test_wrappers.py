"""The installed sh wrappers, run with a stub interpreter: hostile environment values and paths are passed
through untouched (never executed), exit codes are mapped, and a hung Python part is cut off."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastic.hooks import HOOK_MODULES
from slurm_elastic.hooks.install import InstallOptions, bake, install, source_dir

pytestmark = pytest.mark.timeout(60)

STUB = """#!/bin/sh
{ printf 'argv:'; for a in "$@"; do printf ' [%s]' "$a"; done; printf '\\n'; printf 'cwd=%s\\n' "$(pwd)"; env; } \
    > "$STUB_OUT"
if [ -n "${STUB_SLEEP-}" ]; then sleep "$STUB_SLEEP"; fi
exit "${STUB_RC:-0}"
"""
# A directory name that would run commands if a wrapper ever let the shell re-read it.
EVIL_DIR = "py dir $(touch PWNED-dir) `touch PWNED-tick` 'q\" ; touch PWNED-semi"
HOSTILE_ENV = {
    "SLURM_JOB_ID": "$(touch PWNED-env)",
    "SLURMD_NODENAME": "n1;touch PWNED-node",
    "SLURM_JOB_COMMENT": "slurm-elastic:/tmp/$(touch PWNED-comment)/`touch PWNED-c2`/coordinator.json",
    "SLURM_JOB_NAME": 'x"; touch PWNED-name; echo "',
    "SLURM_JOB_UID": "0 ; touch PWNED-uid",
}


def stub_python(root: Path) -> Path:
    directory = root / EVIL_DIR
    directory.mkdir(parents=True)
    stub = directory / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return stub


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    prefix = tmp_path / "prefix"
    install(InstallOptions(prefix=prefix, python=stub_python(tmp_path), timeout_s=1, watch_s=0))
    return prefix


def run_hook(hook: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    out = tmp_path / "stub.out"
    out.unlink(missing_ok=True)
    full = {"STUB_OUT": str(out), **HOSTILE_ENV, **env}  # no PATH: Slurm gives hooks none
    done = subprocess.run([str(hook)], env=full, capture_output=True, text=True, cwd=tmp_path, timeout=30)
    return done, out.read_text() if out.exists() else ""


def no_injection(tmp_path: Path) -> None:
    found = [p for p in tmp_path.rglob("PWNED*")] + [p for p in Path("/").glob("PWNED*")]
    assert found == [], f"a hostile value was executed: {found}"


@pytest.mark.parametrize("name", HOOK_MODULES)
def test_hostile_values_reach_python_unchanged(installed: Path, tmp_path: Path, name: str) -> None:
    done, seen = run_hook(installed / name, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"argv: [-I] [-m] [slurm_elastic.hooks.{name}]" in seen
    assert "cwd=/\n" in seen
    for key, value in HOSTILE_ENV.items():
        assert f"{key}={value}\n" in seen
    assert f"SLURM_ELASTIC_HOOKS_DIR={installed}\n" in seen
    path = next(line for line in seen.splitlines() if line.startswith("PATH="))
    assert path.startswith("PATH=") and "/usr/bin" in path
    no_injection(tmp_path)


def test_exit_codes(installed: Path, tmp_path: Path) -> None:
    assert run_hook(installed / "prolog", tmp_path, STUB_RC="0")[0].returncode == 0
    refused = run_hook(installed / "prolog", tmp_path, STUB_RC="100")[0]
    assert refused.returncode == 1 and refused.stderr == ""
    crashed = run_hook(installed / "epilog", tmp_path, STUB_RC="3")[0]
    assert crashed.returncode == 0
    # One greppable line; the hostile job id and node name are reduced to their safe characters.
    assert crashed.stderr == "slurm-elastic-hook epilog job= node=n1touchPWNED-node action=run result=error rc=3\n"
    no_injection(tmp_path)


def test_a_hung_python_part_is_cut_off(installed: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    done, _ = run_hook(installed / "prolog", tmp_path, STUB_SLEEP="20")
    assert time.monotonic() - started < 10
    assert done.returncode == 0
    assert "action=run result=timeout rc=124" in done.stderr


def test_an_uninstalled_copy_finds_its_own_directory(tmp_path: Path) -> None:
    # SE_HOOKS_DIR left empty: the wrapper takes its own directory, whatever characters its name holds.
    directory = tmp_path / "hooks $(touch PWNED-x) dir"
    directory.mkdir()
    hook = directory / "epilog"
    values = {"SE_PYTHON": str(stub_python(tmp_path)), "SE_HOOKS_DIR": ""}
    hook.write_text(bake((source_dir() / "epilog").read_text(), values))
    hook.chmod(0o755)
    done, seen = run_hook(hook, tmp_path)
    assert done.returncode == 0
    assert f"SLURM_ELASTIC_HOOKS_DIR={directory}\n" in seen
    no_injection(tmp_path)


def test_the_templates_differ_only_in_their_header_and_hook_name() -> None:
    def body(name: str) -> list[str]:
        lines = (source_dir() / name).read_text().splitlines()
        start = lines.index(f"HOOK={name}")
        return lines[start + 1 :]

    first = body(HOOK_MODULES[0])
    assert all(body(name) == first for name in HOOK_MODULES)
    assert all(os.access(source_dir() / name, os.X_OK) for name in HOOK_MODULES)


def test_the_templates_are_posix_sh() -> None:
    for name in HOOK_MODULES:
        subprocess.run(["sh", "-n", str(source_dir() / name)], check=True)
