"""Node checks: verdicts on nvidia-smi output and free space, and the measurements on a temp dir."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_elastic.hooks.checks import (
    Problem,
    cache_problem,
    free_mb,
    gpu_problems,
    reason_for,
    run_checks,
    space_problem,
    target_state,
)
from slurm_elastic.hooks.settings import HookSettings

# `nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits`
# in nvidia-smi's documented csv form (not captured on a GPU here: no GPU machine was available).
EIGHT_HEALTHY = "".join(f"{i}, 00000000:{0x18 + i:02X}:00.0, 0\n" for i in range(8))
ECC_NOT_SUPPORTED = "0, 00000000:01:00.0, [N/A]\n"


def test_healthy_gpus() -> None:
    assert gpu_problems(0, EIGHT_HEALTHY, "", expected=8) == []
    assert gpu_problems(0, EIGHT_HEALTHY, "", expected=0) == []
    assert gpu_problems(0, ECC_NOT_SUPPORTED, "", expected=0) == []


def test_a_missing_gpu_is_fatal() -> None:
    seven = "".join(EIGHT_HEALTHY.splitlines(keepends=True)[:7])
    assert gpu_problems(0, seven, "", expected=8) == [Problem("gpu", "fatal", "7 GPUs visible, expected 8")]
    assert gpu_problems(0, "", "", expected=0) == [Problem("gpu", "fatal", "0 GPUs visible, expected 1")]


def test_nvidia_smi_failing_or_hanging_is_fatal() -> None:
    err = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    (problem,) = gpu_problems(9, "", err, expected=0)
    assert problem.severity == "fatal" and "exit 9" in problem.detail and "couldn't communicate" in problem.detail
    (problem,) = gpu_problems(None, "", "", expected=0)
    assert problem.severity == "fatal" and "did not answer" in problem.detail


def test_broken_rows() -> None:
    text = "0, 00000000:18:00.0, 0\n1, 00000000:19:00.0, 3\n2, Unknown Error\n"
    problems = gpu_problems(0, text, "", expected=3)
    assert Problem("gpu", "degraded", "GPU 1: 3 uncorrected ECC errors") in problems
    assert any(p.severity == "fatal" and p.detail.startswith("GPU 2") for p in problems)
    assert target_state(problems) == "FAIL"


def test_space() -> None:
    assert space_problem("shm", "/dev/shm", 1000, 256) is None
    assert space_problem("shm", "/dev/shm", 10, 256) == Problem("shm", "degraded", "10 MB free in /dev/shm, need 256")
    assert space_problem("spool", "/nope", None, 1) == Problem("spool", "degraded", "/nope is missing")


def test_free_mb(tmp_path: Path) -> None:
    free = free_mb(str(tmp_path))
    assert free is not None and free >= 0
    assert free_mb(str(tmp_path / "missing")) is None


def test_cache_dir_is_created_sticky_and_probed(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "n3"
    assert cache_problem(str(cache)) is None
    mode = cache.stat().st_mode
    assert mode & stat.S_ISVTX and mode & 0o777 == 0o777
    assert list(cache.iterdir()) == []  # the probe file is gone


def test_an_unwritable_cache_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    problem = cache_problem(str(blocker / "cache"))
    assert problem is not None and problem.check == "cache" and problem.severity == "degraded"


def test_run_checks_with_a_stub_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "nvidia-smi"
    stub.write_text("#!/bin/sh\nprintf '0, 00000000:18:00.0, 0\\n'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cache = str(tmp_path / "cache" / "%n")
    ok = HookSettings(cache_dir=cache, expected_gpus=1, min_free_shm_mb=0, min_free_spool_mb=1)
    assert run_checks(ok, "n3", str(tmp_path)) == []
    assert (tmp_path / "cache" / "n3").is_dir()
    greedy = HookSettings(cache_dir=cache, expected_gpus=2, min_free_spool_mb=10**12)
    problems = run_checks(greedy, "n3", str(tmp_path))
    assert [(p.check, p.severity) for p in problems] == [("gpu", "fatal"), ("spool", "degraded")]
    assert target_state(problems) == "FAIL"
    assert run_checks(HookSettings(cache_dir=cache, check_gpus="no", min_free_shm_mb=0), "n3", None) == []


def test_gpus_required_but_no_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    settings = HookSettings(cache_dir=str(tmp_path / "c"), min_free_shm_mb=0)
    assert run_checks(settings, "n1", None) == []  # auto: no nvidia-smi, no GPU check
    problems = run_checks(HookSettings(cache_dir=str(tmp_path / "c"), check_gpus="yes", min_free_shm_mb=0), "n1", None)
    assert problems == [Problem("gpu", "fatal", "nvidia-smi not found")]


def test_reason() -> None:
    problems = [Problem("shm", "degraded", "10 MB free in /dev/shm, need 256"), Problem("gpu", "fatal", "x\ny")]
    reason = reason_for("prolog", problems)
    assert reason == "slurm-elastic prolog: shm: 10 MB free in /dev/shm, need 256; gpu: x?y"
    assert len(reason_for("prolog", [Problem("gpu", "fatal", "z" * 1000)])) <= 250
    assert target_state([]) is None and target_state(problems[:1]) == "DRAIN"
