"""The summary of refused handshakes, on an injected clock: the first refusal at once, then one report per
interval whatever the number of attempts, a bounded list of peers, nothing lost."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.coordinator.refusals import RefusalSummary, refused_by_category
from slurm_elastic.wire.channel import REFUSAL_CATEGORIES


def test_the_first_refusal_is_reported_at_once_the_rest_once_an_interval() -> None:
    summary = RefusalSummary(interval_s=60.0)
    first = summary.note("bad proof", "10.0.0.9", now=100.0)
    assert first == {"count": 1, "seconds": 0.0, "bad_proof": 1, "peers": {"10.0.0.9": 1}}
    for i in range(999):
        assert summary.note("bad proof" if i % 3 else "timeout", "10.0.0.9", now=100.0 + i * 0.05) is None
    assert summary.due() == 160.0
    report = summary.take(160.0)
    assert report is not None
    assert report["count"] == 999 and report["bad_proof"] + report["timeout"] == 999
    assert summary.take(161.0) is None and summary.due() is None


def test_a_refusal_after_a_quiet_interval_is_reported_at_once() -> None:
    summary = RefusalSummary(interval_s=60.0)
    assert summary.note("timeout", "a", now=0.0) is not None
    assert summary.note("timeout", "a", now=30.0) is None  # within the interval: waits
    assert summary.take(60.0) == {"count": 1, "seconds": 30.0, "timeout": 1, "peers": {"a": 1}}
    assert summary.note("wrong job", "b", now=200.0) == {"count": 1, "seconds": 0.0, "wrong_job": 1, "peers": {"b": 1}}


def test_a_refusal_at_the_end_of_the_interval_reports_everything_pending() -> None:
    summary = RefusalSummary(interval_s=10.0)
    summary.note("timeout", "a", now=0.0)
    assert summary.note("not a hello", "a", now=5.0) is None
    report = summary.note("malformed hello", "a", now=10.0)
    assert report == {"count": 2, "seconds": 5.0, "malformed_hello": 1, "not_a_hello": 1, "peers": {"a": 2}}


def test_peers_listed_are_bounded_the_others_counted() -> None:
    summary = RefusalSummary(interval_s=60.0, max_peers=3)
    assert summary.note("bad proof", "first", now=0.0) is not None  # reported at once, on its own
    for i in range(1000):
        summary.note("bad proof", f"10.0.{i // 256}.{i % 256}", now=1.0)
    report = summary.take(60.0)
    assert report is not None
    assert len(report["peers"]) == 3 and report["unlisted_peers_count"] == 997
    assert sum(report["peers"].values()) + report["unlisted_peers_count"] == report["count"] == 1000


@given(
    st.lists(
        st.tuples(st.sampled_from(REFUSAL_CATEGORIES), st.sampled_from(["a", "b", "c"]), st.floats(0, 5)),
        max_size=300,
    ),
    st.floats(0.5, 100),
)
def test_every_refusal_is_counted_once_and_reports_are_an_interval_apart(
    attempts: list[tuple[str, str, float]], interval: float
) -> None:
    summary = RefusalSummary(interval_s=interval)
    now, reports, times = 0.0, [], []
    for category, peer, gap in attempts:
        now += gap
        due = summary.due()
        if due is not None and due <= now:  # the coordinator's timer
            reports.append(summary.take(due))
            times.append(due)
        report = summary.note(category, peer, now)
        if report is not None:
            reports.append(report)
            times.append(now)
    final = summary.take(now + interval)
    reports += [final] if final is not None else []
    events = [{"event": "handshakes_refused", **r} for r in reports if r is not None]
    assert refused_by_category(events) == {c: sum(1 for a in attempts if a[0] == c) for c, _, _ in attempts}
    assert all(later - earlier >= interval - 1e-9 for earlier, later in itertools.pairwise(times))
    assert len(reports) <= 2 + now / interval
