"""`hooks install` and `hooks check` on a temp dir, and the slurm.conf lines they print and verify."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.hooks import HOOK_MODULES
from slurm_elastic.hooks.check import Finding, check_conf, check_installation, parse_slurm_conf
from slurm_elastic.hooks.cli import main
from slurm_elastic.hooks.install import InstallOptions, bake, install, read_baked, slurm_conf_lines

pytestmark = pytest.mark.timeout(120)
PYTHON = Path(sys.executable)
AS_ROOT = os.geteuid() == 0


def levels(findings: list[Finding]) -> dict[str, str]:
    return {f.what: f.level for f in findings}


def test_install_bakes_values_and_writes_a_config(tmp_path: Path) -> None:
    prefix = tmp_path / "hooks"
    done = install(InstallOptions(prefix=prefix, python=PYTHON, timeout_s=15, slurm_conf=Path("/etc/x.conf")))
    assert done[-1] == f"wrote {prefix / 'hooks.toml'}"
    for name in HOOK_MODULES:
        path = prefix / name
        assert path.stat().st_mode & 0o777 == 0o755
        baked = read_baked(path.read_text())
        assert baked["SE_PYTHON"] == str(PYTHON) and baked["SE_TIMEOUT_S"] == "15"
        assert baked["SE_HOOKS_DIR"] == str(prefix)
    config = (prefix / "hooks.toml").read_text()
    assert f'log_dir = "{prefix / "log"}"' in config and 'slurm_conf = "/etc/x.conf"' in config
    assert "\nwatch_s = 1.25\n" in config  # the default HealthCheckInterval (2 s) less 0.75 s
    assert [p.name for p in prefix.iterdir() if p.name.startswith(".")] == []


def test_reinstall_keeps_the_admins_config(tmp_path: Path) -> None:
    opts = InstallOptions(prefix=tmp_path, python=PYTHON)
    install(opts)
    (tmp_path / "hooks.toml").write_text("prolog = false\n")
    assert install(opts)[-1].startswith("kept")
    assert (tmp_path / "hooks.toml").read_text() == "prolog = false\n"
    install(InstallOptions(prefix=tmp_path, python=PYTHON, force_config=True))
    assert "prolog = false" not in (tmp_path / "hooks.toml").read_text()


def test_an_interpreter_path_with_shell_characters_stays_one_word(tmp_path: Path) -> None:
    odd = tmp_path / "it's a $(dir) `x`" / "python"
    odd.parent.mkdir()
    odd.symlink_to(PYTHON)
    install(InstallOptions(prefix=tmp_path / "p", python=odd))
    assert read_baked((tmp_path / "p" / "epilog").read_text())["SE_PYTHON"] == str(odd)


@pytest.mark.parametrize("prefix", ["relative/dir", "/opt/with space", "/opt/hash#dir", "/opt/quote'd", "/opt/a=b"])
def test_prefixes_slurm_conf_cannot_carry_are_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="--prefix"):
        install(InstallOptions(prefix=Path(prefix), python=PYTHON))


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an executable"):
        install(InstallOptions(prefix=tmp_path, python=tmp_path / "nope"))
    with pytest.raises(ConfigError, match="between 1 and 300"):
        install(InstallOptions(prefix=tmp_path, python=PYTHON, timeout_s=0))
    with pytest.raises(ConfigError, match="at least 2: with 1, slurmctld"):
        install(InstallOptions(prefix=tmp_path, python=PYTHON, healthcheck_interval_s=1))
    with pytest.raises(ConfigError, match="--watch 30 must be 0, or at most"):
        install(InstallOptions(prefix=tmp_path, python=PYTHON, watch_s=30))
    with pytest.raises(ConfigError, match="--source"):
        install(InstallOptions(prefix=tmp_path / "p", python=PYTHON, source=tmp_path / "empty"))


def test_bake_needs_exactly_one_line_per_setting() -> None:
    with pytest.raises(ConfigError, match="2 `SE_PYTHON=` lines"):
        bake("SE_PYTHON=a\nSE_PYTHON=b\n", {"SE_PYTHON": "/x"})
    assert bake("A=1\nSE_PYTHON=python3\n", {"SE_PYTHON": "/a b"}) == "A=1\nSE_PYTHON='/a b'\n"


def test_check_a_fresh_installation(tmp_path: Path) -> None:
    install(InstallOptions(prefix=tmp_path, python=PYTHON))
    findings = check_installation(tmp_path)
    assert all(f.level == "ok" for f in findings), [str(f) for f in findings]
    assert "slurm-elastic" in next(f.detail for f in findings if f.what == "interpreter")


def test_check_finds_what_is_wrong(tmp_path: Path) -> None:
    install(InstallOptions(prefix=tmp_path, python=PYTHON))
    (tmp_path / "epilog").unlink()
    (tmp_path / "healthcheck").chmod(0o644)
    (tmp_path / "hooks.toml").write_text("bogus = 1\n")
    found = levels(check_installation(tmp_path))
    assert found["epilog"] == "FAIL" and found["healthcheck"] == "FAIL" and found["hooks.toml"] == "FAIL"
    assert found["prolog"] == "ok" and found["epilog_slurmctld"] == "ok"
    (tmp_path / "epilog_slurmctld").unlink()
    assert levels(check_installation(tmp_path))["epilog_slurmctld"] == "ok"  # optional


def test_check_a_watch_longer_than_the_wrappers_bound(tmp_path: Path) -> None:
    install(InstallOptions(prefix=tmp_path, python=PYTHON, timeout_s=20))
    (tmp_path / "hooks.toml").write_text("watch_s = 18.0\n")
    assert levels(check_installation(tmp_path))["hooks.toml"] == "FAIL"


def test_check_a_broken_interpreter(tmp_path: Path) -> None:
    install(InstallOptions(prefix=tmp_path, python=PYTHON))
    text = (tmp_path / "prolog").read_text()
    (tmp_path / "prolog").write_text(bake(text, {"SE_PYTHON": "/usr/bin/false"}))
    assert levels(check_installation(tmp_path))["interpreter"] == "FAIL"


@pytest.mark.skipif(not AS_ROOT, reason="the ownership rules apply when run as root")
def test_check_as_root_refuses_files_others_could_change(tmp_path: Path) -> None:
    install(InstallOptions(prefix=tmp_path, python=PYTHON))
    (tmp_path / "prolog").chmod(0o775)
    os.chown(tmp_path / "epilog", 12345, -1)
    os.chown(tmp_path / "hooks.toml", 12345, -1)
    found = levels(check_installation(tmp_path, as_root=True))
    assert found["prolog"] == "FAIL" and found["epilog"] == "FAIL" and found["hooks.toml"] == "FAIL"
    assert levels(check_installation(tmp_path, as_root=False))["prolog"] == "ok"


def test_the_printed_lines_pass_the_check() -> None:
    prefix = Path("/opt/se")
    conf = parse_slurm_conf("\n".join(slurm_conf_lines(prefix, timeout_s=20)))
    assert "epilogslurmctld" not in conf  # printed commented out: optional
    assert all(f.level == "ok" for f in check_conf(conf, prefix, 20))


@pytest.mark.parametrize(
    ("lines", "what", "level"),
    [
        ("", "slurm.conf epilog", "FAIL"),
        ("Epilog=/opt/se/epilog", "slurm.conf epilog", "ok"),
        ("Prolog=/elsewhere/prolog", "slurm.conf prolog", "FAIL"),
        ("HealthCheckInterval=0", "slurm.conf HealthCheckInterval", "FAIL"),
        ("HealthCheckInterval=1", "slurm.conf HealthCheckInterval", "FAIL"),  # starves slurmctld's pings
        ("HealthCheckInterval=2", "slurm.conf HealthCheckInterval", "ok"),
        ("HealthCheckInterval=30", "slurm.conf HealthCheckInterval", "warn"),
        ("PrologFlags=Contain", "slurm.conf PrologFlags", "FAIL"),
        ("PrologFlags=Alloc,Contain", "slurm.conf PrologFlags", "ok"),
        ("PrologEpilogTimeout=20", "slurm.conf PrologEpilogTimeout", "FAIL"),
        ("PrologTimeout=90\nEpilogTimeout=90", "slurm.conf PrologEpilogTimeout", "ok"),  # 25.05 spelling
    ],
)
def test_conf_findings(lines: str, what: str, level: str) -> None:
    base = "Prolog=/opt/se/prolog\nHealthCheckProgram=/opt/se/healthcheck # the health check\n"
    conf = parse_slurm_conf(base + lines + "\n")
    assert levels(check_conf(conf, Path("/opt/se"), 20))[what] == level


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "se"
    assert main(["hooks", "install", "--prefix", str(prefix), "--python", str(PYTHON)]) == 0
    out = capsys.readouterr().out
    assert f"    Prolog={prefix / 'prolog'}" in out and "    HealthCheckInterval=2" in out
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(slurm_conf_lines(prefix)) + "\n")
    assert main(["hooks", "check", "--prefix", str(prefix), "--slurm-conf", str(conf)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"ok: {prefix}")
    conf.write_text("Prolog=/x\n")
    assert main(["hooks", "check", "--prefix", str(prefix), "--slurm-conf", str(conf)]) == 1
    assert main(["hooks", "install", "--prefix", "/tmp/with space"]) == 2


def _venv(where: Path) -> Path:
    """A virtualenv of this interpreter that imports the hooks and their dependencies; its python."""
    import subprocess

    import slurm_elastic

    subprocess.run([str(PYTHON), "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    (site,) = where.glob("lib/python3*/site-packages")
    here = [p for p in sys.path if p.endswith("site-packages")]
    (site / "se.pth").write_text("\n".join([str(Path(slurm_elastic.__file__).parents[1]), *here]) + "\n")
    return where / "bin" / "python"


@pytest.mark.skipif(not AS_ROOT, reason="the ownership rules apply when run as root")
def test_check_as_root_refuses_an_interpreter_a_user_could_replace(tmp_path: Path) -> None:
    """The admin points --python at a virtualenv in a user's directory: that user then runs code as root."""
    python = _venv(tmp_path / "home" / "alice" / "venv")
    os.chown(tmp_path / "home" / "alice", 65534, 65534)
    install(InstallOptions(prefix=tmp_path / "hooks", python=python))
    findings = {f.what: f for f in check_installation(tmp_path / "hooks", as_root=True)}
    assert findings["interpreter"].level == "ok", findings  # it runs, and imports the hooks
    owner = findings["interpreter owner"]
    assert owner.level == "FAIL" and f"{tmp_path}/home/alice is owned by uid 65534, not root" in owner.detail
    assert findings["import path"].level == "FAIL"  # its site-packages is under alice's directory too


@pytest.mark.skipif(not AS_ROOT, reason="the ownership rules apply when run as root")
def test_check_as_root_refuses_a_site_packages_a_user_could_write_to(tmp_path: Path) -> None:
    """A root-owned virtualenv whose site-packages holds one file of another user (a sitecustomize.py:
    Python runs it at every start, as root under Slurm)."""
    python = _venv(tmp_path / "venv")
    (site,) = (tmp_path / "venv").glob("lib/python3*/site-packages")
    install(InstallOptions(prefix=tmp_path / "hooks", python=python))
    findings = {f.what: f for f in check_installation(tmp_path / "hooks", as_root=True)}
    assert findings["interpreter owner"].level == "ok" and findings["import path"].level == "ok", findings
    planted = site / "sitecustomize.py"
    planted.write_text("")
    os.chown(planted, 65534, 65534)
    found = {f.what: f for f in check_installation(tmp_path / "hooks", as_root=True)}["import path"]
    assert found.level == "FAIL" and f"{planted} is owned by uid 65534, not root" in found.detail
    os.chown(planted, 0, 0)
    planted.chmod(0o666)
    found = {f.what: f for f in check_installation(tmp_path / "hooks", as_root=True)}["import path"]
    assert found.level == "FAIL" and "writable by group or others (-rw-rw-rw-)" in found.detail
