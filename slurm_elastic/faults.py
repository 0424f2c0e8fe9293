"""A declarative fault plan, shipped for tests, demos and benchmarks.

    plan = FaultPlan().kill(node="local2", step=5, phase="backward").stop(node="local3", step=9)

The plan travels to workers in the environment (`SLURM_ELASTIC_FAULTS`, JSON); each worker fires the
faults that name its node and local rank at the named step and phase, once, and only in its first
incarnation (a restarted worker does not fire them again). With a record directory
(`SLURM_ELASTIC_FAULTS_FIRED`, `FaultPlan(fired_dir=...)`) each fault leaves a marker there as it fires, so
that it fires once per job even where a node's agent is started again (incarnation 0 anew, on Slurm), and
whoever planned the faults can tell which ones fired.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from slurm_elastic.errors import ConfigError

FaultPhase = Literal[
    "forward", "backward", "bucket", "reduce_scatter", "allreduce", "optimizer", "commit", "recovery", "transfer"
]
FaultAction = Literal["kill", "kill_node", "stop", "raise", "corrupt"]
ENV_VAR = "SLURM_ELASTIC_FAULTS"
FIRED_ENV_VAR = "SLURM_ELASTIC_FAULTS_FIRED"


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    step: int = Field(ge=1)
    phase: FaultPhase = "forward"
    action: FaultAction = "kill"
    local_rank: int = Field(default=0, ge=0)
    incarnation: int = Field(default=0, ge=0)
    after: bool = False  # fire at the first `phase` of step `step` or any later step (a recovery, a transfer)


_FAULTS: TypeAdapter[list[Fault]] = TypeAdapter(list[Fault])


class FaultPlan:
    """An immutable list of faults with a small builder API."""

    def __init__(self, faults: tuple[Fault, ...] = (), fired_dir: Path | None = None) -> None:
        self.faults = faults
        self.fired_dir = fired_dir

    def add(self, **fields: object) -> FaultPlan:
        return FaultPlan((*self.faults, Fault.model_validate(fields)), self.fired_dir)

    def recorded_in(self, fired_dir: Path) -> FaultPlan:
        """The same faults, each fired once per job and marked in `fired_dir` (see `fired`)."""
        return FaultPlan(self.faults, fired_dir)

    def fired(self) -> list[bool]:
        """For each fault, whether a worker fired it (needs a record directory)."""
        if self.fired_dir is None:
            raise ValueError("this fault plan keeps no record of what fired (FaultPlan.recorded_in)")
        return [fired_marker(self.fired_dir, i).exists() for i in range(len(self.faults))]

    def kill(self, node: str, step: int, phase: FaultPhase = "forward", local_rank: int = 0) -> FaultPlan:
        """SIGKILL the worker itself."""
        return self.add(node=node, step=step, phase=phase, local_rank=local_rank, action="kill")

    def kill_node(self, node: str, step: int, phase: FaultPhase = "forward") -> FaultPlan:
        """SIGKILL the worker's whole process group: its agent and every worker of the node."""
        return self.add(node=node, step=step, phase=phase, action="kill_node")

    def stop(self, node: str, step: int, phase: FaultPhase = "forward", local_rank: int = 0) -> FaultPlan:
        """SIGSTOP the worker: it hangs with its sockets open."""
        return self.add(node=node, step=step, phase=phase, local_rank=local_rank, action="stop")

    def raise_error(self, node: str, step: int, phase: FaultPhase = "forward", local_rank: int = 0) -> FaultPlan:
        """Raise an ordinary exception, as a bug in the user's code would."""
        return self.add(node=node, step=step, phase=phase, local_rank=local_rank, action="raise")

    def corrupt(self, node: str, step: int, local_rank: int = 0) -> FaultPlan:
        """Flip bits in the worker's own copy of its shard when the first generation forms before step `step`
        or a later one (after its digest was taken at the last commit: a sharded job's bad memory)."""
        return self.add(node=node, step=step, phase="recovery", local_rank=local_rank, action="corrupt", after=True)

    def to_env(self) -> dict[str, str]:
        if not self.faults:
            return {}
        fired = {FIRED_ENV_VAR: str(self.fired_dir)} if self.fired_dir else {}
        return {ENV_VAR: _FAULTS.dump_json(list(self.faults)).decode(), **fired}

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str]) -> FaultPlan:
        raw = env.get(ENV_VAR)
        if not raw:
            return cls()
        fired = env.get(FIRED_ENV_VAR)
        try:
            return cls(tuple(_FAULTS.validate_json(raw)), Path(fired) if fired else None)
        except ValidationError as exc:
            raise ConfigError(f"invalid {ENV_VAR}: {exc.errors()[0]['msg']}") from None


def fired_marker(fired_dir: Path, index: int) -> Path:
    """The record that fault `index` of a plan fired."""
    return fired_dir / f"fault-{index}"
