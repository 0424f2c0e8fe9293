"""A coordinator run on a thread leaves nothing open once stopped: a loop left open is reported by the garbage
collector (ResourceWarning for the loop and its self-pipe sockets) in whatever code happens to run then."""

from __future__ import annotations

import gc
import warnings

import pytest

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.wire.channel import connect, new_secret

pytestmark = pytest.mark.timeout(60)


def test_a_stopped_coordinator_thread_leaves_no_open_loop_or_socket() -> None:
    secret = new_secret()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        thread = CoordinatorThread(CoordinatorConfig(job_id="t", secret=secret, expected_workers=1)).start()
        channel = connect(thread.address, secret=secret, job_id="t", role="worker")  # a peer still connected
        thread.stop()
        channel.close()
        del thread
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
