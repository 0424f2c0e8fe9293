"""A real coordinator on 127.0.0.1 for the rendezvous store's tests, stopped by each test that used it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.coordinator.driver import STORE_PREFIX
from slurm_elastic.wire import channel as ch

JOB = "store-test"


@pytest.fixture
def coordinator() -> Iterator[tuple[CoordinatorThread, str]]:
    secret = ch.new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=secret, expected_workers=4)).start()
    try:
        yield thread, secret
    finally:
        thread.stop()


def key(generation: int, name: str) -> str:
    """A key of generation `generation`'s groups, as the workers name them."""
    return f"{STORE_PREFIX}/g{generation}/{name}"
