"""A real node agent runs its node's store relay: its workers' stores connect to it (an abstract Unix socket,
the job's secret proven), identical reads of the node's workers reach the coordinator once, and
SLURM_ELASTIC_STORE_RELAY=0 turns it off (the workers then reach the coordinator themselves). Every process
a test starts ends within it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.coordinator.driver import STORE_PREFIX
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(150)
KEY = f"{STORE_PREFIX}/g1/uid"

# Local rank 0 publishes the key once the others said they are about to read it (and a moment more, for their
# reads to be in flight); each worker writes where its store went and what it read.
WORKER = textwrap.dedent(
    f"""
    import os, sys, time
    from pathlib import Path
    import slurm_elastic
    from slurm_elastic.rendezvous.client import CoordinatorStore
    from slurm_elastic.worker.env import worker_env

    out, readers = Path(sys.argv[1]), int(sys.argv[2])
    env = worker_env()
    address = env.store or env.coordinator
    store = CoordinatorStore(address, env.secret, env.job_id, 60)
    rank = env.local_rank
    if rank == 0:
        while len(list(out.glob("reading.*"))) < readers:
            time.sleep(0.05)
        time.sleep(0.5)
        store.set({KEY!r}, b"unique-id")
        value = b"unique-id"
    else:
        (out / f"reading.{{rank}}").write_text("")
        value = store.get({KEY!r})
    (out / f"done.{{rank}}").write_text(f"{{address}} {{value.decode()}}")
    store.close()
    """
)


def run_node(tmp_path: Path, nproc: int, relay: bool) -> tuple[dict[str, str], int]:
    """One agent of `nproc` workers against a real coordinator: what each worker wrote, and the gets the
    coordinator served."""
    secret = new_secret()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    thread = CoordinatorThread(CoordinatorConfig(job_id="relay", secret=secret, expected_workers=nproc)).start()
    try:
        argv = [sys.executable, "-m", "slurm_elastic.agent", "--coordinator", thread.address, "--job-id", "relay"]
        argv += ["--node", "n1", "--nproc", str(nproc), "--max-restarts", "0", "--"]
        argv += [sys.executable, str(script), str(tmp_path), str(nproc - 1)]
        env = {**os.environ, "SLURM_ELASTIC_SECRET": secret, "SLURM_ELASTIC_STORE_RELAY": "1" if relay else "0"}
        agent = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        gets = thread.call(lambda: thread.coordinator.store.served["get"])
    finally:
        thread.stop()
    done = {p.name: p.read_text() for p in tmp_path.glob("done.*")}
    assert len(done) == nproc, agent.stderr[-3000:]
    return done, gets


def test_a_nodes_workers_read_through_its_agents_relay(tmp_path: Path) -> None:
    done, gets = run_node(tmp_path, nproc=3, relay=True)
    addresses = {text.split()[0] for text in done.values()}
    assert len(addresses) == 1 and addresses.pop().startswith("unix:@slurm-elastic-relay-")
    assert {text.split()[1] for text in done.values()} == {"unique-id"}
    assert gets == 1  # two workers' reads, one at the coordinator


def test_the_relay_can_be_turned_off(tmp_path: Path) -> None:
    done, gets = run_node(tmp_path, nproc=3, relay=False)
    assert all(text.split()[0].startswith("127.0.0.1:") for text in done.values())
    assert gets == 2
