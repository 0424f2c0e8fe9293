"""A seeded plan of faults for `slurm-elastic chaos`: which fault, at which step, to which node.

The plan follows the job's membership as it will be (a killed node is gone, a joined node arrives), so that
every fault hits a node that is there, at least one holder of the training state always survives (the job
must lose no committed step), and the world never falls below `min_nodes` without a join to refill it.
The same seed always gives the same plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

ChaosKind = Literal[
    "worker_kill",  # SIGKILL of one training process, in a random phase of a step
    "node_loss",  # SIGKILL of a node's agent and workers at once
    "hang",  # SIGSTOP of a training process: evicted by hang detection
    "join",  # a new node
    "drain",  # a node asked to leave at the next step boundary
    "recovery_fault",  # SIGKILL of a process while the next generation forms
    "transfer_fault",  # SIGKILL of a source while a joiner receives the state
    "shrink",  # Slurm takes nodes away (scontrol update NumNodes)
    "reclaim",  # an operator gives a node back (slurm-elastic reclaim)
    "preempt_satellite",  # a satellite job is preempted by a higher-priority job
    "partition",  # a node's link down for longer than a lease: evicted by silence, back when the link is
    "link_flap",  # a node's link down for less than a lease: a pause, nobody leaves
    "one_way_cut",  # what a node sends to one peer vanishes (both still reach the coordinator): one side goes
    "batch_host_cut",  # the batch host's link down: its side stops, the others requeue; resumed from disk
]
LOCAL_KINDS: tuple[ChaosKind, ...] = (
    "worker_kill", "node_loss", "hang", "join", "drain", "recovery_fault", "transfer_fault",
)  # fmt: skip
SLURM_KINDS: tuple[ChaosKind, ...] = (
    "worker_kill", "node_loss", "hang", "recovery_fault", "transfer_fault", "shrink", "reclaim",
    "preempt_satellite", "drain", "partition", "link_flap", "one_way_cut", "batch_host_cut",
)  # fmt: skip
LINK_KINDS: tuple[ChaosKind, ...] = (  # need nodes as separate hosts
    "partition", "link_flap", "one_way_cut", "batch_host_cut",
)  # fmt: skip
ABRUPT: tuple[ChaosKind, ...] = (  # each starts a recovery
    "worker_kill", "node_loss", "hang", "shrink", "partition", "one_way_cut",
)  # fmt: skip
STEP_PHASES = ("forward", "backward", "bucket", "allreduce", "optimizer", "commit")


@dataclass(frozen=True)
class ChaosFault:
    step: int  # fires at (or, for recovery and transfer faults, after) this committed step
    kind: ChaosKind
    node: str | None  # the node it hits; None for a join (the launcher names the newcomer) or a reclaim that
    # gives back whichever satellite `slurm-elastic reclaim` chooses
    phase: str | None = None  # for a worker kill or hang: where in the step
    peer: str | None = None  # for a one-way cut: the node whose packets from `node` vanish


def plan_chaos(
    seed: int,
    faults: int,
    *,
    nodes: int,
    min_nodes: int = 2,
    first_step: int = 5,
    spacing: tuple[int, int] = (6, 12),
    kinds: tuple[ChaosKind, ...] = LOCAL_KINDS,
    node_prefix: str = "local",
) -> list[ChaosFault]:
    """`faults` faults over a job that starts on `nodes` nodes named `<prefix>1..`; joins are named in order."""
    if faults < 0 or nodes < min_nodes or min_nodes < 2:
        raise ValueError(f"need faults >= 0 and nodes >= min_nodes >= 2, got {faults}, {nodes}, {min_nodes}")
    rng = random.Random(seed)
    alive = [f"{node_prefix}{i}" for i in range(1, nodes + 1)]
    next_node = nodes + 1
    step = first_step
    plan: list[ChaosFault] = []
    while len(plan) < faults:
        kind = rng.choice(kinds)
        if kind != "join" and len(alive) <= min_nodes:
            kind = "join"  # refill first: a fault must always leave a holder of the state and min_nodes
        if kind == "transfer_fault" and len(plan) + 1 >= faults:
            kind = "join"  # a transfer fault needs its join within the budget
        if kind == "join":
            plan.append(ChaosFault(step, "join", None))
            alive.append(f"{node_prefix}{next_node}")
            next_node += 1
        elif kind == "transfer_fault":
            # A joiner arrives; while it receives the state, a source node dies.
            plan.append(ChaosFault(step, "join", None))
            plan.append(ChaosFault(step, "transfer_fault", rng.choice(alive)))
            alive.remove(plan[-1].node)  # type: ignore[arg-type]
            alive.append(f"{node_prefix}{next_node}")
            next_node += 1
        else:
            victim = rng.choice(alive)
            phase = rng.choice(STEP_PHASES) if kind in ("worker_kill", "hang") else None
            plan.append(ChaosFault(step, kind, victim, phase))
            alive.remove(victim)
        step += rng.randint(*spacing)
    return plan[:faults]


def plan_slurm_chaos(
    seed: int,
    faults: int,
    *,
    nodes: tuple[str, ...],
    first_step: int = 5,
    spacing: tuple[int, int] = (10, 16),
    kinds: tuple[ChaosKind, ...] = SLURM_KINDS,
    resizes: int = 1,
) -> list[ChaosFault]:
    """`faults` faults over a Slurm job that starts on all of `nodes`, the first being its batch host.

    After each fault the job is refilled to len(nodes) before the next (the lost node's agent is started
    again, or a satellite takes the node a shrink or a reclaim freed), so the plan follows where the core
    job's allocation ends: a shrink takes its last node, a reclaim a satellite first, then the core's last
    node (as `scontrol update NumNodes` and `slurm-elastic reclaim` do). The batch host is hit by a
    `batch_host_cut` only, and only as the last fault: its loss takes the disaster path (a requeue, then a
    resume from the checkpoint on an allocation of Slurm's choosing), where the plan's names and pacing no
    longer hold. Faults inside training processes hit core nodes only, whose environment carries the
    plan; a recovery fault is followed by a fault that starts a recovery, and neither a recovery nor a
    transfer fault ends the plan (each needs a successor).
    At most `resizes` faults shrink the core job: without accounting (no slurmdbd, as on the local
    cluster) slurmctld refuses every update of a job after its first resize ("the DB index is being set").
    """
    if faults < 0 or len(nodes) < 3:
        raise ValueError(f"need faults >= 0 and at least 3 nodes, got {faults} and {list(nodes)}")
    rng = random.Random(seed)
    core = list(nodes)
    satellites: list[str] = []
    armed: ChaosFault | None = None  # a recovery or transfer fault waiting for its successor
    step = first_step
    plan: list[ChaosFault] = []
    while len(plan) < faults:
        targets = [n for n in core[1:] if armed is None or n != armed.node]
        last = len(plan) + 1 == faults
        shrinkable = len(core) >= 3 and len(nodes) - len(core) < resizes and (armed is None or core[-1] != armed.node)
        feasible = {
            "worker_kill": bool(targets), "node_loss": bool(targets), "hang": bool(targets),
            # An armed node needs another for its successor to hit.
            "recovery_fault": len(targets) >= 2 and armed is None and not last,
            "transfer_fault": len(targets) >= 2 and armed is None and not last,
            "shrink": shrinkable, "reclaim": bool(satellites) or shrinkable,
            "preempt_satellite": bool(satellites), "drain": bool(satellites),
            "partition": bool(targets), "link_flap": bool(targets),
            # Between two nodes that are not the batch host, the coordinator's: both keep their way to it.
            "one_way_cut": len(targets) >= 2,
            "batch_host_cut": last and armed is None,
        }  # fmt: skip
        choices = [k for k in kinds if feasible.get(k, False)]
        if armed is not None and armed.kind == "recovery_fault":
            choices = [k for k in choices if k in ABRUPT]
        if not choices:
            raise ValueError(f"no fault of {list(kinds)} is possible with core {core} and satellites {satellites}")
        kind = rng.choice(choices)
        node: str | None
        if kind in ("shrink", "reclaim") and not (kind == "reclaim" and satellites):
            node = core.pop()
            satellites.append(node)  # the refill: a satellite on the node that was freed
        elif kind == "reclaim":
            node = None  # whichever satellite `slurm-elastic reclaim` gives back; a new one takes its place
        elif kind in ("preempt_satellite", "drain"):
            node = rng.choice(satellites)
        elif kind == "batch_host_cut":
            node = core[0]
        else:
            node = rng.choice(targets)
        phase = rng.choice(STEP_PHASES) if kind in ("worker_kill", "hang") else None
        peer = rng.choice([n for n in targets if n != node]) if kind == "one_way_cut" else None
        fault = ChaosFault(step, kind, node, phase, peer)
        plan.append(fault)
        armed = fault if kind in ("recovery_fault", "transfer_fault") else None
        step += rng.randint(*spacing)
    return plan


def steps_needed(plan: list[ChaosFault], tail: int = 20) -> int:
    """Steps the job must train: past the last fault, with room for its recovery."""
    return (max((f.step for f in plan), default=0)) + tail
