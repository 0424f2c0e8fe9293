"""What a sharded (FSDP2) generation resumes from: the step, who must first finish it, and which copies count.

A sharded step commits in two phases. Each rank sends its reduced gradient shard to the rank that mirrors
its shard, and only then takes part in the step's last sum (loss, flags, gradient norm). A rank whose sum
completed with every rank clean commits the step, on its own shard and on the shard it mirrors. If a
rank dies during that sum, some survivors committed and others did not; but every rank had sent and
received its gradients before the sum could complete anywhere, so a survivor one step behind that holds
them ("prepared") finishes the step itself ("rolls forward"): no committed step is lost and no holder is
left at an older step than its peers.

`plan_heal` reads every member's report and decides:
- the target: the newest committed step (or a fresh start from the lowest-ranked member's initial state,
  held also by every member whose initial model has the same digest);
- which members roll forward first (one step behind, prepared), with the step's gradient norm and
  learning-rate factor as the committed members recorded them;
- the holdings that may serve: copies at the target whose self-check passed and whose digest agrees with
  the other copy of the same shard (two copies that disagree are both refused: which one is right is
  unknown, and resuming from either could be resuming from corrupt state).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from slurm_elastic.decide.reshard import Holding


@dataclass(frozen=True)
class ShardReport:
    """One member's account of what it holds, as exchanged when a generation forms."""

    rank: int
    committed_step: int  # -1: fresh (a joiner, or a job's start): holds nothing committed
    prepared: bool  # holds the reduced gradients of step committed_step + 1
    world: int  # the layout its copies are cut in
    index: int  # its own shard of that layout
    mirror: int  # the shard it mirrors, -1 for none
    primary_ok: bool  # its own copy still matches the digest taken when it was committed
    mirror_ok: bool
    primary_digest: int  # digest of its own copy at committed_step
    mirror_digest: int
    norm2: float = 0.0  # of its last committed step: the squared gradient norm and learning-rate factor
    lr_factor: float = 1.0


@dataclass(frozen=True)
class HealPlan:
    target_step: int
    fresh: bool
    source: int  # the member whose small replicated state (progress, optimizer counters, scheduler) all take
    roll_forward: tuple[int, ...]
    norm2: float
    lr_factor: float
    holdings: tuple[Holding, ...]
    refused: tuple[str, ...]  # why copies were not trusted, one line each
    reason: str


def plan_heal(reports: list[ShardReport]) -> HealPlan:
    if not reports:
        raise ValueError("plan_heal needs at least one member's report")
    committed = [r for r in reports if r.committed_step >= 0]
    if not committed:
        return _fresh(reports)
    target = max(r.committed_step for r in committed)
    at_target = sorted((r for r in committed if r.committed_step == target), key=lambda r: r.rank)
    behind = sorted(r.rank for r in committed if r.committed_step == target - 1 and r.prepared)
    usable = [r for r in reports if r in at_target or r.rank in behind]
    refused: list[str] = []
    copies: list[tuple[Holding, int, bool]] = []  # holding, digest, comparable (recorded at the target)
    for r in usable:
        for index, ok, digest, what in (
            (r.index, r.primary_ok, r.primary_digest, "own"),
            (r.mirror, r.mirror_ok, r.mirror_digest, "mirrored"),
        ):
            if index < 0:
                continue
            if not ok:
                refused.append(f"rank {r.rank}'s {what} copy of shard {index}/{r.world} fails its digest check")
                continue
            copies.append((Holding(str(r.rank), r.world, index), digest, r.committed_step == target))
    digests: dict[tuple[int, int], set[int]] = defaultdict(set)
    for h, digest, comparable in copies:
        if comparable:
            digests[(h.world, h.index)].add(digest)
    split = {shard for shard, seen in digests.items() if len(seen) > 1}
    for world, index in sorted(split):
        refused.append(f"the copies of shard {index}/{world} disagree at step {target}: none is trusted")
    holdings = tuple(sorted({h for h, _, _ in copies if (h.world, h.index) not in split}))
    source = at_target[0]
    note = f"; ranks {behind} finish step {target} first" if behind else ""
    reason = f"resume at step {target} from {len(holdings)} copies{note}" + (
        f"; {len(refused)} refused" if refused else ""
    )
    return HealPlan(
        target, False, source.rank, tuple(behind), source.norm2, source.lr_factor, holdings, tuple(refused), reason
    )


def _fresh(reports: list[ShardReport]) -> HealPlan:
    """Every member starts from the lowest-ranked one's initial state. A member whose own initial model (the
    whole of it, as the script built it) has the same digest holds it too and takes its rows locally: a
    seeded script moves nothing at its start."""
    first = min(reports, key=lambda r: r.rank)
    same = [
        r.rank
        for r in reports
        if first.world == r.world == 1 and r.index == 0 and r.primary_ok and r.primary_digest == first.primary_digest
    ]
    holders = sorted({first.rank, *same})
    holdings = tuple(Holding(str(rank), 1, 0) for rank in holders)
    local = f"; {len(holders)} members hold the same and take their rows locally" if len(holders) > 1 else ""
    reason = f"fresh start: every member takes its rows of rank {first.rank}'s initial state{local}"
    return HealPlan(0, True, first.rank, (), 0.0, 1.0, holdings, (), reason)


__all__ = ["HealPlan", "ShardReport", "plan_heal"]
