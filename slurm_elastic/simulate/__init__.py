"""`slurm-elastic simulate`: a discrete-event simulation of a long training run at scale, under failures,
repairs and preemption, for checkpoint-restart and for our two recoveries, from our measured figures."""

from __future__ import annotations

from typing import Any

from slurm_elastic.simulate.scenario import Measured, Scenario
from slurm_elastic.simulate.strategies import STRATEGIES, Outcome, policy, run_policy
from slurm_elastic.simulate.timeline import capacity_changes

__all__ = ["Measured", "Outcome", "Scenario", "simulate"]


def simulate(scenario: Scenario, measured: Measured, seed: int = 0) -> dict[str, Outcome]:
    """Every strategy against the same timeline drawn from `seed`."""
    changes = capacity_changes(scenario, seed)
    return {name: run_policy(policy(name, scenario, measured), scenario, changes) for name in STRATEGIES}


def report(scenario: Scenario, measured: Measured, seed: int, outcomes: dict[str, Outcome]) -> dict[str, Any]:
    return {
        "gpus": scenario.gpus,
        "days": scenario.days,
        "seed": seed,
        "nodes": scenario.nodes,
        "spare_nodes": scenario.spares,
        "failures_per_gpu_hour": scenario.failures_per_gpu_hour,
        "measured": measured.model_dump(),
        "strategies": {name: outcome.as_json() for name, outcome in outcomes.items()},
    }
