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
]
LOCAL_KINDS: tuple[ChaosKind, ...] = (
    "worker_kill", "node_loss", "hang", "join", "drain", "recovery_fault", "transfer_fault",
)  # fmt: skip
STEP_PHASES = ("forward", "backward", "bucket", "allreduce", "optimizer", "commit")


@dataclass(frozen=True)
class ChaosFault:
    step: int  # fires at (or, for recovery and transfer faults, after) this committed step
    kind: ChaosKind
    node: str | None  # the node it hits; None for a join (the launcher names the newcomer)
    phase: str | None = None  # for a worker kill or hang: where in the step


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


def steps_needed(plan: list[ChaosFault], tail: int = 20) -> int:
    """Steps the job must train: past the last fault, with room for its recovery."""
    return (max((f.step for f in plan), default=0)) + tail
