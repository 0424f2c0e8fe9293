"""A recovery from a peer lost to silence says how long after its last word the next step committed."""

from __future__ import annotations

import time

from slurm_elastic.coordinator.record import Record
from slurm_elastic.events import EventLog
from slurm_elastic.wire import messages as msg


def _commit(step: int, generation: int) -> msg.Committed:
    return msg.Committed(generation=generation, step=step, loss=1.0, samples=4, world=2, time=time.time())


def _recovered(events: EventLog) -> list[dict]:
    return [e for e in events.recent() if e["event"] == "recovered"]


def test_a_silent_peers_recovery_reports_the_time_from_its_last_word_to_the_commit() -> None:
    events = EventLog("silence")
    record = Record(events, record_commits=False, progress_interval_s=60)
    record.commit(_commit(4, 1))
    record.silence_evicted(time.monotonic() - 6.0)  # silent for a lease and more
    record.silence_evicted(time.monotonic() - 2.0)  # a later last word of another peer: the earliest counts
    record.recovery_began(2)
    record.commit(_commit(5, 2))
    (recovered,) = _recovered(events)
    assert recovered["silent_to_commit_s"] >= 6.0 > recovered["detect_to_commit_s"]
    # The next recovery, from a crash seen at once, has no silence to report.
    record.recovery_began(3)
    record.commit(_commit(6, 3))
    assert _recovered(events)[-1]["silent_to_commit_s"] is None
