"""Refused handshakes, summarised: a peer without the job's secret costs the job's events one line per
interval, however often it tries, and none of that line is its own text.

Pure: `note` and `take` are given the time; the coordinator emits what they return, and arranges a
`take` when the interval ends (refusals that stop coming are reported all the same).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from slurm_elastic.wire.channel import REFUSAL_CATEGORIES

__all__ = ["MAX_PEERS_LISTED", "REFUSAL_INTERVAL_S", "RefusalSummary", "refused_by_category"]

REFUSAL_INTERVAL_S = 60.0  # the first refusal is reported at once, then at most one summary per interval
MAX_PEERS_LISTED = 8  # peer addresses named in one summary; refusals from others are counted only


class RefusalSummary:
    """Counts refusals by category and peer address (the kernel's, never the peer's words) until reported."""

    def __init__(self, interval_s: float = REFUSAL_INTERVAL_S, max_peers: int = MAX_PEERS_LISTED) -> None:
        self.interval_s = interval_s
        self.max_peers = max_peers
        self._reasons: Counter[str] = Counter()
        self._peers: Counter[str] = Counter()
        self._unlisted = 0
        self._since: float | None = None  # the first refusal not yet reported
        self._reported: float | None = None  # the last report

    @property
    def pending(self) -> int:
        return sum(self._reasons.values())

    def due(self) -> float | None:
        """When the refusals counted so far may be reported: at once for the first of a quiet period, else
        an interval after the last report. None when nothing waits."""
        if not self.pending:
            return None
        if self._reported is None:
            return self._since
        return self._reported + self.interval_s

    def note(self, category: str, peer: str, now: float) -> dict[str, Any] | None:
        """Count one refusal; returns the summary to report now, or None when it must wait."""
        if self._since is None:
            self._since = now
        self._reasons[category] += 1
        if peer in self._peers or len(self._peers) < self.max_peers:
            self._peers[peer] += 1
        else:
            self._unlisted += 1
        due = self.due()
        return self.take(now) if due is not None and now >= due else None

    def take(self, now: float) -> dict[str, Any] | None:
        """The summary of every refusal not yet reported (None if none), as event fields; starts a new one.
        Its category counts are fields named after the categories (`bad_proof=998`)."""
        if not self.pending:
            return None
        since = now if self._since is None else self._since
        fields: dict[str, Any] = {"count": self.pending, "seconds": round(now - since, 3)}
        fields.update({reason.replace(" ", "_"): n for reason, n in sorted(self._reasons.items())})
        fields["peers"] = dict(self._peers.most_common())
        if self._unlisted:
            fields["unlisted_peers_count"] = self._unlisted
        self._reasons.clear()
        self._peers.clear()
        self._unlisted = 0
        self._since = None
        self._reported = now
        return fields


def refused_by_category(events: Iterable[dict[str, Any]]) -> Counter[str]:
    """Refused handshakes by category over a job's `handshakes_refused` events (for tools and tests)."""
    fields = {category.replace(" ", "_"): category for category in REFUSAL_CATEGORIES}
    counts: Counter[str] = Counter()
    for event in events:
        if event.get("event") == "handshakes_refused":
            counts.update({fields[k]: int(v) for k, v in event.items() if k in fields})
    return counts
