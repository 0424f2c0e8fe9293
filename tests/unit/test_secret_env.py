"""The job's secret reaches the workers and nothing else. A real node agent (`python -m slurm_elastic.agent`,
given the secret as the launchers give it) starts a training script against a real coordinator; the script
does what a user's code might: `import slurm_elastic` (the documented first line), then starts a shell that
dumps its environment, lists and reads every descriptor it inherited, and reads the start-up environment
(/proc/<pid>/environ) of every process from the agent's child down. None of it shows the secret, and the
script still proves the secret to the coordinator. Every process a test starts ends within it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(150)

# The snooping child: everything a process the training code starts can see without ptrace. It reads each
# inherited descriptor but 0-2 (its own stdin and output) through /proc, as `cat /proc/self/fd/*` would.
SNOOP = r"""
env
ls -l /proc/$$/fd
for f in /proc/$$/fd/*; do
  case ${f##*/} in 0|1|2) ;; *) echo "== $f"; timeout 2 cat "$f" </dev/null 2>&1 ;; esac
done
"""

USER_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys
    import slurm_elastic  # the documented first line
    if len(sys.argv) > 3 and sys.argv[3] == "worker":
        import slurm_elastic.worker  # the whole worker library, torch included

    report = f"{sys.argv[1]}.{os.environ['SLURM_ELASTIC_INCARNATION']}"
    seen = subprocess.run(["sh", "-c", sys.argv[2]], stdin=subprocess.DEVNULL, capture_output=True).stdout
    pid = os.getpid()  # the start-up environment of this process and of each of its ancestors below the agent
    while True:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"slurm_elastic.agent" in fh.read():
                break
        with open(f"/proc/{pid}/environ", "rb") as fh:
            seen += f"== /proc/{pid}/environ\\n".encode() + fh.read().replace(b"\\0", b"\\n")
        with open(f"/proc/{pid}/stat") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
    with open(report, "wb") as fh:
        fh.write(seen)

    from slurm_elastic.jobsecret import handed_over
    from slurm_elastic.wire import messages as msg
    from slurm_elastic.wire.channel import request

    env = os.environ
    reply = request(env["SLURM_ELASTIC_COORDINATOR"], msg.StatusRequest(), secret=handed_over(),
                    job_id=env["SLURM_ELASTIC_JOB_ID"])
    with open(report, "ab") as fh:
        fh.write(f"proved the secret: {reply.type}\\n".encode())
    crash = env["SLURM_ELASTIC_INCARNATION"] == "0" and sys.argv[3:] == ["crash"]
    sys.exit(7 if crash else 0)  # a crash: the agent starts it again
    """
)


def run_agent(tmp_path: Path, secret: str, command: list[str], max_restarts: int = 0) -> str:
    """Run one agent (and its workers) to its end against a real coordinator; returns the agent's stderr."""
    thread = CoordinatorThread(CoordinatorConfig(job_id="env", secret=secret, expected_workers=1)).start()
    try:
        argv = [sys.executable, "-m", "slurm_elastic.agent", "--coordinator", thread.address, "--job-id", "env"]
        argv += ["--node", "n1", "--max-restarts", str(max_restarts), "--", *command]
        env = {**os.environ, "SLURM_ELASTIC_SECRET": secret}  # as `slurm-elastic run` and srun give it
        agent = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    finally:
        thread.stop()
    return agent.stderr


def check_nothing_leaked(report: Path, secret: str, stderr: str, processes: int = 1) -> None:
    assert report.exists(), stderr[-3000:]
    seen = report.read_text()
    assert "PATH=" in seen and "== /proc/" in seen  # the snoop really ran
    assert seen.count("/environ\n") == processes  # the worker, and the wrapper between it and the agent
    assert "SLURM_ELASTIC_SECRET=" not in seen
    assert secret not in seen
    assert seen.endswith("proved the secret: status_reply\n"), stderr[-3000:]  # it did reach the worker


@pytest.mark.parametrize(
    ("wrapper", "processes"),
    [
        pytest.param([], 1, id="python-directly"),
        pytest.param(["bash", "-c", '"$0" "$@"; exit $?'], 2, id="bash-c-python"),  # bash stays, python its child
        pytest.param(["sh", "-c", 'exec "$0" "$@"'], 1, id="sh-c-exec-python"),
    ],
)
def test_the_training_script_and_its_children_never_see_the_secret(
    tmp_path: Path, wrapper: list[str], processes: int
) -> None:
    secret = new_secret()
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    stderr = run_agent(tmp_path, secret, [*wrapper, sys.executable, str(script), str(tmp_path / "seen"), SNOOP])
    check_nothing_leaked(tmp_path / "seen.0", secret, stderr, processes)


def test_a_restarted_worker_gets_the_secret_through_a_pipe_of_its_own(tmp_path: Path) -> None:
    secret = new_secret()
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    stderr = run_agent(tmp_path, secret, [sys.executable, str(script), str(tmp_path / "seen"), SNOOP, "crash"], 1)
    check_nothing_leaked(tmp_path / "seen.0", secret, stderr)
    check_nothing_leaked(tmp_path / "seen.1", secret, stderr)


def test_proc_environ_holds_no_secret_even_after_the_whole_worker_library_is_imported(tmp_path: Path) -> None:
    """What the kernel keeps of the worker's start-up environment (/proc/<pid>/environ) does not change when
    a library removes a variable from os.environ: the secret must never have been in it."""
    secret = new_secret()
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    stderr = run_agent(tmp_path, secret, [sys.executable, str(script), str(tmp_path / "seen"), SNOOP, "worker"])
    check_nothing_leaked(tmp_path / "seen.0", secret, stderr)
