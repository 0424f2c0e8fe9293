"""An agent leaves its exit code where its batch script (a satellite's) or its launcher (a core job's) reads
it: in the job's own private directory, never in /tmp under a name anyone can guess, and never written
through a link planted at the marker's name. The satellite template still tells a preempted agent (75,
requeue) from one that ended (0) when srun's own status says neither: it runs here under bash with a fake
`srun` and `scontrol`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.agent import EXIT_DRAINED_BY_SIGNAL, Agent, AgentConfig
from slurm_elastic.decide.agent import Signalled
from slurm_elastic.exitmarker import SATELLITE_EXITS, read_exit_code, satellite_marker
from slurm_elastic.jobdir import job_dir, make_job_dir

pytestmark = pytest.mark.timeout(60)
TEMPLATE = Path(__file__).resolve().parents[2] / "sbatch_templates" / "elastic_satellite.sbatch"
REPO = Path(__file__).resolve().parents[2]


def test_the_agent_never_writes_its_exit_code_through_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    directory = make_job_dir(job_dir("7", tmp_path / "home"))
    exits = directory / "exits"
    exits.mkdir(mode=0o700)
    (exits / "n1").symlink_to(victim)  # the core job's marker for node n1
    marker = directory / SATELLITE_EXITS / "42"
    marker.parent.mkdir(mode=0o700)
    marker.symlink_to(victim)  # a satellite's marker
    monkeypatch.setenv("SLURM_ELASTIC_EXIT_DIR", str(exits))
    monkeypatch.setenv("SLURM_ELASTIC_EXIT_MARKER", str(marker))
    config = AgentConfig(
        node="n1", nproc=1, coordinator="127.0.0.1:1", secret="s" * 32, job_id=f"marker-{os.getpid()}", command=["x"]
    )
    agent = Agent(config)
    agent._see(Signalled("SIGTERM"))  # preempted: the code a satellite requeues on

    assert agent._supervise() == EXIT_DRAINED_BY_SIGNAL  # no workers: it ends at once, and says how

    assert victim.read_text() == "precious"
    for path in (exits / "n1", marker):
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, path  # the link was replaced
        assert read_exit_code(path) == str(EXIT_DRAINED_BY_SIGNAL)
    assert sorted(p.name for p in exits.iterdir()) == ["n1"]  # no temporary file left behind


def test_a_node_name_that_is_not_one_plain_name_writes_no_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_elastic.exitmarker import write_exit_code

    exits = make_job_dir(job_dir("7", tmp_path / "home")) / "exits"
    exits.mkdir(mode=0o700)
    write_exit_code({"SLURM_ELASTIC_EXIT_DIR": str(exits)}, "../escaped", 1)
    write_exit_code({"SLURM_ELASTIC_EXIT_DIR": str(exits)}, "n2", 0)
    assert sorted(p.name for p in exits.parent.iterdir()) == ["exits"]
    assert [p.name for p in exits.iterdir()] == ["n2"]


def test_a_marker_outside_a_private_directory_of_the_user_is_not_written(tmp_path: Path) -> None:
    """The old place, a shared sticky directory such as /tmp (even one of the user's), is refused and
    logged, never used, and never made private either."""
    from slurm_elastic.exitmarker import write_exit_code

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    write_exit_code({"SLURM_ELASTIC_EXIT_MARKER": str(shared / "slurm-elastic-satellite-42.exit")}, "n1", 75)
    assert list(shared.iterdir()) == []
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_the_satellite_marker_is_in_the_core_jobs_private_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with pytest.raises(Exception, match="no job '7' under"):
        satellite_marker("7", "42", home)  # no such core job: nothing is made
    assert not home.exists()
    core = make_job_dir(job_dir("7", home))
    marker = satellite_marker("7", "42", home)
    assert marker == core / SATELLITE_EXITS / "42"
    assert stat.S_IMODE(marker.parent.stat().st_mode) == 0o700 and not marker.exists()


def fake_slurm_bin(tmp_path: Path, agent_code: int) -> Path:
    """`srun` writes the agent's code where the agent would (as the agent writes it) and fails as srun does
    when Slurm cancelled its step; `scontrol` records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write = "import os; from slurm_elastic.exitmarker import write_exit_code as w; w(os.environ, 'n1', {code})"
    (bin_dir / "srun").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$SLURM_ELASTIC_EXIT_MARKER" >> "{tmp_path}/srun-markers"\n'
        f'"$SE_PYTHON" -c "{write.format(code=agent_code)}"\n'
        "exit 137\n"
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/scontrol-calls"\n')
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(("agent_code", "requeued"), [(EXIT_DRAINED_BY_SIGNAL, True), (0, False)])
def test_the_satellite_template_reads_its_agents_code_from_the_core_jobs_directory(
    tmp_path: Path, agent_code: int, requeued: bool
) -> None:
    home = tmp_path / "home"
    core = make_job_dir(job_dir("7", home))
    (core / SATELLITE_EXITS).mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (core / SATELLITE_EXITS / "42").symlink_to(victim)  # left at the marker's name before the satellite ran
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    env = {
        "PATH": f"{fake_slurm_bin(tmp_path, agent_code)}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SE_PYTHON": sys.executable,
        "SLURM_ELASTIC_HOME": str(home),
        "SLURM_ELASTIC_CORE_JOB": "7",
        "SLURM_JOB_ID": "42",
        "TMPDIR": str(shared_tmp),
    }
    done = subprocess.run(["bash", str(TEMPLATE)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert f"srun exited with 137, agent with {agent_code} " in done.stdout
    calls = (tmp_path / "scontrol-calls").read_text().splitlines() if (tmp_path / "scontrol-calls").exists() else []
    assert calls == (["requeue 42"] if requeued else [])
    assert (tmp_path / "srun-markers").read_text().splitlines() == [str(core / SATELLITE_EXITS / "42")]
    assert list(shared_tmp.iterdir()) == []  # nothing in the shared temporary directory
    assert list((core / SATELLITE_EXITS).iterdir()) == []  # the marker is removed once read
    assert victim.read_text() == "precious"


def test_the_satellite_template_stops_when_the_core_jobs_directory_is_missing(tmp_path: Path) -> None:
    env = {
        "PATH": f"{fake_slurm_bin(tmp_path, 0)}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SE_PYTHON": sys.executable,
        "SLURM_ELASTIC_HOME": str(tmp_path / "home"),
        "SLURM_ELASTIC_CORE_JOB": "7",
        "SLURM_JOB_ID": "42",
    }
    done = subprocess.run(["bash", str(TEMPLATE)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("slurm-elastic: error: no job '7' under") and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "srun-markers").exists()  # srun never ran


def test_the_core_launcher_reads_its_agents_codes_from_the_jobs_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_elastic.config import JobConfig
    from slurm_elastic.exitmarker import fresh_core_exits, write_exit_code
    from slurm_elastic.launch.slurm import SlurmLaunch
    from slurm_elastic.testing.fakeslurm import FakeSlurm

    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(tmp_path / "home"))
    launch = SlurmLaunch(JobConfig(), ["train"], FakeSlurm("n[1-2]"), "7")
    exits = fresh_core_exits(make_job_dir(launch.dir))
    assert stat.S_IMODE(exits.stat().st_mode) == 0o700
    env = {"SLURM_ELASTIC_EXIT_DIR": str(exits)}
    for node, code in (("n1", 0), ("n2", 1), ("n3", EXIT_DRAINED_BY_SIGNAL)):
        write_exit_code(env, node, code)
    (exits / ".n4.0123.tmp").write_text("1\n")  # a temporary name of a write cut short
    assert launch.agents_failed() == ["the agent of n2 exited with 1"]
    assert list(fresh_core_exits(launch.dir).iterdir()) == []  # a requeued run starts with none


def test_an_agent_that_could_not_start_leaves_its_reason_on_one_bounded_line(tmp_path: Path) -> None:
    from slurm_elastic.exitmarker import REASON_CHARS, read_exit_reason, write_exit_code

    exits = make_job_dir(job_dir("8", tmp_path / "home")) / "exits"
    exits.mkdir(mode=0o700)
    env = {"SLURM_ELASTIC_EXIT_DIR": str(exits)}
    write_exit_code(env, "n1", 1, reason="SLURM_ELASTIC_IFNAME='ib0':\nno such interface")
    write_exit_code(env, "n2", 1, reason="x" * (REASON_CHARS * 3))
    write_exit_code(env, "n3", 0)
    assert (read_exit_code(exits / "n1"), read_exit_reason(exits / "n1")) == (
        "1",
        "SLURM_ELASTIC_IFNAME='ib0': no such interface",
    )
    assert read_exit_reason(exits / "n2") == "x" * REASON_CHARS
    assert (read_exit_code(exits / "n3"), read_exit_reason(exits / "n3")) == ("0", "")
    assert read_exit_reason(exits / "n4") == ""  # none left
